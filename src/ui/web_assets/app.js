/* toki web: the chat UI. Plain JavaScript, no libraries, nothing fetched
 * from elsewhere. It talks only to toki web (/api/...), which relays to the
 * daemon and adds the daemon's token; this page never sees that token.
 *
 * The session secret comes in the URL's fragment (#k=...), which browsers do
 * not send; it moves to sessionStorage (this tab only) and the fragment is
 * removed from the address bar. Every /api/ call carries it as
 * Authorization: Bearer. */
'use strict';
(() => {
	const $ = (id) => document.getElementById(id);
	const KEY_NAME = 'tokiWebKey';
	const SVG = 'http://www.w3.org/2000/svg';

	let key = null;
	const conversation = []; /* user/assistant messages, resent every turn */
	const turns = []; /* {n, mode, raw, cached, route} for the chart and table */
	let busy = null; /* the AbortController of the turn in flight */
	let daemonUp = null;
	let retryTimer = null;

	/* ---- the session secret ---- */

	function takeKey() {
		const m = /(?:^#|[#&])k=([0-9A-Za-z_-]+)/.exec(location.hash);
		if (m) {
			sessionStorage.setItem(KEY_NAME, m[1]);
			window.history.replaceState(null, '', location.pathname + location.search);
		}
		key = sessionStorage.getItem(KEY_NAME);
	}

	function api(path, opts = {}) {
		const headers = Object.assign({}, opts.headers || {}, {Authorization: 'Bearer ' + (key || '')});
		return fetch('/api' + path, Object.assign({}, opts, {headers, cache: 'no-store'}));
	}

	async function errorOf(resp) {
		const text = await resp.text();
		try {
			const j = JSON.parse(text);
			if (j && j.error)
				return typeof j.error === 'string' ? j.error : j.error.message || JSON.stringify(j.error);
		} catch (e) { /* not JSON */ }
		return `HTTP ${resp.status}: ${text.slice(0, 300)}`;
	}

	/* ---- the daemon's state ---- */

	function banner(message) {
		$('banner-text').textContent = message || '';
		$('banner').hidden = !message;
	}

	function setDaemon(up, text) {
		daemonUp = up;
		$('daemon-dot').className = 'dot ' + (up ? 'up' : 'down');
		if (text !== undefined)
			$('daemon-info').textContent = text;
		clearTimeout(retryTimer);
		if (!up)
			retryTimer = setTimeout(checkDaemon, 5000);
	}

	async function checkDaemon() {
		if (!key) {
			setDaemon(false, 'no session secret');
			clearTimeout(retryTimer);
			banner('This page needs the link that toki web printed (it ends in #k=...). Open that link.');
			return;
		}
		let info;
		try {
			const r = await api('/info');
			if (r.status === 401) {
				setDaemon(false, 'not signed in');
				clearTimeout(retryTimer);
				banner('toki web did not accept this page\'s session secret (was toki web restarted?). Open the link it printed.');
				return;
			}
			if (!r.ok)
				throw new Error(await errorOf(r));
			info = await r.json();
		} catch (e) {
			setDaemon(false, 'toki web is not reachable');
			banner('toki web is not reachable: ' + e.message);
			return;
		}
		try {
			const r = await api('/v1/models');
			if (!r.ok)
				throw new Error(await errorOf(r));
			const models = await r.json();
			const m = (models.data || [])[0] || {};
			const ctx = m.context_length || (m.meta && m.meta.n_ctx_train) || null;
			const name = (m.id || 'model').split('/').pop();
			setDaemon(true, `${name}${ctx ? ' · ' + ctx + ' tokens context' : ''} · daemon ${info.daemon}`);
			banner('');
			refreshModels();
		} catch (e) {
			setDaemon(false, `daemon ${info.daemon} · down`);
			banner(e.message);
		}
	}

	/* ---- the endpoint's models ---- */

	const fmtBytes = (b) =>
		b >= 1048576 ? `${(b / 1048576).toFixed(1)} MiB` : b >= 1024 ? `${(b / 1024).toFixed(1)} KiB` : `${b} B`;
	const fmtS = (v) => (v ? `${v.toFixed(1)} s` : '—');

	/* The endpoint for the registry (toki up) says what each model did: its
	 * state, loads and unloads, its last swap's seconds and the slot bytes
	 * saved and restored across swaps. A single model's daemon has no such
	 * list: the table stays hidden. Asked when the daemon is found and after
	 * each turn (a turn may have swapped models). */
	async function refreshModels() {
		let s;
		try {
			const r = await api('/toki/stats');
			if (!r.ok)
				return;
			s = await r.json();
		} catch (e) {
			return;
		}
		$('models-box').hidden = !s.endpoint;
		if (!s.endpoint)
			return;
		const body = $('models').tBodies[0];
		body.replaceChildren(...(s.models || []).map((m) => {
			const tr = document.createElement('tr');
			tr.dataset.model = m.name;
			tr.dataset.state = m.state;
			const cells = [['name', m.name], ['state', m.state], ['loads', String(m.loads)],
				['unloads', String(m.unloads)], ['start', fmtS(m.last_start_s)], ['stop', fmtS(m.last_stop_s)],
				['saved', fmtBytes(m.saved_bytes || 0)], ['restored', fmtBytes(m.restored_bytes || 0)]];
			for (const [k, v] of cells) {
				const td = document.createElement('td');
				td.dataset.k = k;
				td.textContent = v;
				tr.append(td);
			}
			return tr;
		}));
	}

	/* ---- one request, streamed ---- */

	const fmtMs = (v) => (v == null ? '—' : v < 10000 ? `${Math.round(v)} ms` : `${(v / 1000).toFixed(1)} s`);
	const fmtN = (v) => (v == null ? '—' : String(v));

	/* The prefill rate measured on raw turns (ms per token), for estimating
	 * what a cached turn saved when there is no raw run beside it. */
	let rawMsPerToken = null;

	function answerView(parent, mode) {
		const el = document.createElement('div');
		el.className = 'answer';
		el.dataset.mode = mode;
		el.dataset.state = 'running';
		const head = document.createElement('div');
		head.className = 'answer-head';
		const tag = document.createElement('span');
		tag.className = 'tag ' + mode;
		tag.textContent = mode;
		const route = document.createElement('span');
		route.className = 'route';
		route.hidden = true;
		const note = document.createElement('span');
		note.className = 'note';
		head.append(tag, route);
		if (mode === 'raw') {
			const off = document.createElement('span');
			off.className = 'cache-off';
			off.textContent = 'cache_prompt off';
			off.title = 'llama-server evaluates the whole prompt, whatever its slot holds';
			head.append(off);
		}
		head.append(note);
		const text = document.createElement('div');
		text.className = 'text';
		const stats = document.createElement('dl');
		stats.className = 'stats';
		const cells = {};
		for (const [k, label] of [['ttft', 'TTFT'], ['evaluated', 'evaluated'], ['cached', 'cached'], ['total', 'total'], ['speedup', 'speed-up']]) {
			const d = document.createElement('div');
			d.dataset.k = k;
			const dt = document.createElement('dt');
			dt.textContent = label;
			const dd = document.createElement('dd');
			dd.textContent = '—';
			d.append(dt, dd);
			stats.append(d);
			cells[k] = dd;
		}
		el.append(head, text, stats);
		parent.append(el);
		return {el, route, note, text, cells};
	}

	function showRoute(view, route) {
		if (!route)
			return;
		view.route.hidden = false;
		view.route.textContent = route;
		view.route.className = 'route ' + route;
		view.route.title = view.el.dataset.mode === 'raw'
			? `toki's route: ${route} (but cache_prompt was off, so nothing was reused)`
			: `toki's route: ${route}`;
	}

	async function streamChat(mode, messages, view, signal) {
		const body = {messages, stream: true, temperature: 0, max_tokens: Math.max(1, parseInt($('max-tokens').value, 10) || 64)};
		if (mode === 'raw')
			body.cache_prompt = false; /* llama-server evaluates everything */
		const r = {mode, text: '', ttft: null, total: null, cache: null, timings: null, route: null, reads: 0, pieces: 0};
		const t0 = performance.now();
		const tick = setInterval(() => {
			if (r.ttft == null)
				view.cells.ttft.textContent = `${((performance.now() - t0) / 1000).toFixed(1)} s…`;
		}, 100);
		try {
			let resp;
			try {
				resp = await api('/v1/chat/completions', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body), signal});
			} catch (e) {
				if (e.name === 'AbortError')
					throw e;
				throw new Error('toki web is not reachable: ' + e.message);
			}
			if (!resp.ok)
				throw new Error(await errorOf(resp));
			const reader = resp.body.getReader();
			const dec = new TextDecoder();
			let buf = '';
			const onEvent = (ev) => {
				for (const line of ev.split(/\r?\n/)) {
					if (line.startsWith(':')) {
						/* ": toki route=hit slot=0 prompt=1268 reuse=1024 evaluate=244 est_prefill_ms=410" */
						const m = /toki route=(\S+).*?prompt=(\d+).*?evaluate=(\d+).*?est_prefill_ms=(\d+)/.exec(line);
						if (m) {
							r.route = m[1];
							showRoute(view, m[1]);
							view.note.textContent = `prompt ${m[2]} tokens, ${m[3]} to evaluate, est. ${m[4]} ms`;
						}
						continue;
					}
					if (!line.startsWith('data:'))
						continue;
					const data = line.slice(5).trim();
					if (data === '[DONE]' || !data)
						continue;
					let j;
					try {
						j = JSON.parse(data);
					} catch (e) {
						continue;
					}
					if (j.error)
						throw new Error(typeof j.error === 'string' ? j.error : j.error.message);
					const delta = j.choices && j.choices[0] && j.choices[0].delta;
					const content = delta && delta.content;
					if (content) {
						r.pieces++; /* the answer's deltas, however the reads cut them */
						if (r.ttft == null) {
							r.ttft = performance.now() - t0;
							view.cells.ttft.textContent = fmtMs(r.ttft);
						}
						r.text += content;
						view.text.textContent = r.text;
					}
					if (j.cache)
						r.cache = j.cache;
					if (j.timings)
						r.timings = j.timings;
				}
			};
			for (;;) {
				const {done, value} = await reader.read();
				if (done)
					break;
				r.reads++; /* pieces of the stream as they arrived */
				buf += dec.decode(value, {stream: true});
				let m;
				while ((m = /\r?\n\r?\n/.exec(buf))) {
					const ev = buf.slice(0, m.index);
					buf = buf.slice(m.index + m[0].length);
					onEvent(ev);
				}
			}
			if (buf.trim())
				onEvent(buf);
		} finally {
			clearInterval(tick);
		}
		r.total = performance.now() - t0;
		if (r.ttft == null) /* nothing generated: the wait for the end */
			r.ttft = r.total;
		const c = r.cache || {};
		const t = r.timings || {};
		r.evaluated = c.evaluated != null ? c.evaluated : t.prompt_n != null ? t.prompt_n : null;
		r.cached = c.cached != null ? c.cached : t.cache_n != null ? t.cache_n : null;
		if (c.route)
			r.route = c.route;
		r.msPerToken = t.prompt_n > 0 && t.prompt_ms > 0 ? t.prompt_ms / t.prompt_n : null;
		showRoute(view, r.route);
		view.note.textContent = '';
		view.cells.ttft.textContent = fmtMs(r.ttft);
		view.cells.evaluated.textContent = fmtN(r.evaluated);
		view.cells.cached.textContent = fmtN(r.cached);
		view.cells.total.textContent = fmtMs(r.total);
		view.el.dataset.state = 'done';
		return r;
	}

	/* ---- turns ---- */

	function messagesWith(userText) {
		const msgs = [];
		const sys = $('system').value.trim();
		if (sys)
			msgs.push({role: 'system', content: sys});
		return msgs.concat(conversation, [{role: 'user', content: userText}]);
	}

	function setBusy(controller) {
		busy = controller;
		const b = $('send');
		b.textContent = controller ? 'Stop' : 'Send';
		b.classList.toggle('stop', !!controller);
		$('new-chat').disabled = !!controller;
	}

	async function send() {
		if (busy) {
			busy.abort();
			return;
		}
		const text = $('prompt').value.trim();
		if (!text)
			return;
		const mode = document.querySelector('input[name="mode"]:checked').value;
		const n = turns.length + 1;
		const msgs = messagesWith(text);
		$('empty').hidden = true;

		const el = document.createElement('article');
		el.className = 'turn';
		el.dataset.turn = String(n);
		el.dataset.mode = mode;
		el.dataset.state = 'running';
		const head = document.createElement('div');
		head.className = 'turn-head';
		const label = document.createElement('span');
		label.textContent = `turn ${n} · ${mode} · ${msgs.length} messages sent`;
		const speed = document.createElement('span');
		speed.className = 'speedup';
		head.append(label, speed);
		const user = document.createElement('div');
		user.className = 'user';
		user.textContent = text;
		const answers = document.createElement('div');
		answers.className = 'answers' + (mode === 'compare' ? ' compare' : '');
		el.append(head, user, answers);
		$('turns').append(el);
		$('composer').scrollIntoView({block: 'end'});

		const views = {};
		if (mode !== 'cached')
			views.raw = answerView(answers, 'raw');
		if (mode !== 'raw')
			views.cached = answerView(answers, 'cached');
		const controller = new AbortController();
		setBusy(controller);
		$('prompt').value = '';
		const res = {};
		let current = null;
		try {
			for (const m of ['raw', 'cached']) {
				if (!views[m])
					continue;
				current = m;
				res[m] = await streamChat(m, msgs, views[m], controller.signal);
			}
			if (res.raw && res.raw.msPerToken)
				rawMsPerToken = res.raw.msPerToken;
			if (res.raw && res.cached && res.cached.ttft > 0) {
				const s = res.raw.ttft / res.cached.ttft;
				views.cached.cells.speedup.textContent = `${s.toFixed(1)}×`;
				views.raw.cells.speedup.textContent = '1×';
				speed.textContent = `cached is ${s.toFixed(1)}× faster to the first token`;
			} else if (res.cached) {
				const rate = rawMsPerToken || res.cached.msPerToken;
				if (rate && res.cached.cached > 0 && res.cached.ttft > 0) {
					const s = (res.cached.ttft + res.cached.cached * rate) / res.cached.ttft;
					views.cached.cells.speedup.textContent = `≈${s.toFixed(1)}×`;
					views.cached.cells.speedup.title = 'estimated: the cached tokens at the measured prefill rate';
				}
			} else if (res.raw) {
				views.raw.cells.speedup.textContent = '1×';
			}
			const kept = res.cached || res.raw;
			conversation.push({role: 'user', content: text}, {role: 'assistant', content: kept.text});
			turns.push({n, mode, raw: res.raw || null, cached: res.cached || null, route: (res.cached || res.raw).route});
			el.dataset.state = 'done';
			redraw();
			refreshModels();
			$('composer').scrollIntoView({block: 'end'});
		} catch (e) {
			el.dataset.state = 'error';
			if (current && views[current])
				views[current].el.dataset.state = 'error';
			const err = document.createElement('div');
			err.className = 'error';
			err.textContent = e.name === 'AbortError' ? 'stopped' : e.message;
			el.append(err);
			if (e.name !== 'AbortError') {
				$('prompt').value = text; /* to send again */
				checkDaemon();
			}
		} finally {
			setBusy(null);
		}
	}

	function newConversation() {
		conversation.length = 0;
		turns.length = 0;
		for (const t of document.querySelectorAll('#turns .turn'))
			t.remove();
		$('empty').hidden = false;
		redraw();
	}

	/* ---- the chart and the table ---- */

	function el(name, attrs, text) {
		const e = document.createElementNS(SVG, name);
		for (const [k, v] of Object.entries(attrs || {}))
			e.setAttribute(k, String(v));
		if (text != null)
			e.textContent = text;
		return e;
	}

	function niceMax(v) {
		if (!(v > 0))
			return 1;
		const p = Math.pow(10, Math.floor(Math.log10(v)));
		for (const f of [1, 2, 2.5, 5, 10])
			if (f * p >= v)
				return f * p;
		return 10 * p;
	}

	/* One panel: a metric over the turns, one series per mode. fmt(v, max)
	 * labels the axis. */
	function panel(svg, y0, title, metric, fmt) {
		const W = 360, H = 150, L = 46, R = 10, T = 18, B = 22;
		const g = el('g', {transform: `translate(0,${y0})`, 'data-metric': metric});
		svg.append(g);
		g.append(el('text', {x: 0, y: 11, class: 'title'}, title));
		const pw = W - L - R, ph = H - T - B;
		const vals = [];
		for (const t of turns)
			for (const m of ['raw', 'cached'])
				if (t[m] && t[m][metric] != null)
					vals.push(t[m][metric]);
		const max = niceMax(Math.max(0, ...vals));
		const n = Math.max(turns.length, 1);
		const x = (i) => L + (n === 1 ? pw / 2 : (i * pw) / (n - 1));
		const y = (v) => T + ph - (v / max) * ph;
		for (let k = 0; k <= 4; k++) {
			const v = (max * k) / 4;
			g.append(el('line', {x1: L, x2: W - R, y1: y(v), y2: y(v), class: k ? 'grid' : 'axis'}));
			if (turns.length)
				g.append(el('text', {x: L - 4, y: y(v) + 3, 'text-anchor': 'end'}, fmt(v, max)));
		}
		g.append(el('line', {x1: L, x2: L, y1: T, y2: T + ph, class: 'axis'}));
		turns.forEach((t, i) => g.append(el('text', {x: x(i), y: H - 6, 'text-anchor': 'middle'}, String(t.n))));
		if (!turns.length)
			g.append(el('text', {x: L + pw / 2, y: T + ph / 2, 'text-anchor': 'middle', class: 'nodata'}, 'no turns yet'));
		for (const m of ['raw', 'cached']) {
			const pts = [];
			turns.forEach((t, i) => {
				if (t[m] && t[m][metric] != null)
					pts.push([x(i), y(t[m][metric]), t]);
			});
			if (pts.length > 1)
				g.append(el('polyline', {points: pts.map((p) => `${p[0].toFixed(1)},${p[1].toFixed(1)}`).join(' '), class: 'line-' + m}));
			for (const [px, py, t] of pts) {
				const c = el('circle', {cx: px.toFixed(1), cy: py.toFixed(1), r: 3.5, class: 'pt pt-' + m, 'data-turn': t.n, 'data-value': Math.round(t[m][metric])});
				c.append(el('title', {}, `turn ${t.n} ${m}: ${Math.round(t[m][metric])}${metric === 'ttft' ? ' ms' : ' tokens'}`));
				g.append(c);
			}
		}
	}

	function redraw() {
		const box = $('chart');
		box.textContent = '';
		const svg = el('svg', {viewBox: '0 0 360 330', role: 'img', 'aria-label': 'TTFT and evaluated tokens per turn, raw and cached'});
		/* legend */
		svg.append(el('circle', {cx: 200, cy: 7, r: 4, class: 'pt-raw'}));
		svg.append(el('text', {x: 208, y: 11}, 'raw'));
		svg.append(el('circle', {cx: 250, cy: 7, r: 4, class: 'pt-cached'}));
		svg.append(el('text', {x: 258, y: 11}, 'cached'));
		const ms = (v, max) => (max >= 2000 ? `${+(v / 1000).toFixed(1)} s` : `${Math.round(v)} ms`);
		const tokens = (v, max) => (max >= 10000 ? `${+(v / 1000).toFixed(1)}k` : String(Math.round(v)));
		panel(svg, 4, 'time to first token', 'ttft', ms);
		panel(svg, 170, 'evaluated prompt tokens', 'evaluated', tokens);
		box.append(svg);

		const tbody = document.querySelector('#summary tbody');
		tbody.textContent = '';
		for (const t of turns) {
			const tr = document.createElement('tr');
			const cells = [t.n, t.route || '—', t.raw ? fmtMs(t.raw.ttft) : '', t.cached ? fmtMs(t.cached.ttft) : '', t.raw ? fmtN(t.raw.evaluated) : '', t.cached ? fmtN(t.cached.evaluated) : ''];
			for (const v of cells) {
				const td = document.createElement('td');
				td.textContent = v;
				tr.append(td);
			}
			tbody.append(tr);
		}
	}

	function systemSize() {
		const n = $('system').value.length;
		$('system-size').textContent = n ? `(${n} characters)` : '(none)';
	}

	/* ---- start ---- */

	takeKey();
	$('composer').addEventListener('submit', (e) => {
		e.preventDefault();
		send();
	});
	$('prompt').addEventListener('keydown', (e) => {
		if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
			e.preventDefault();
			if (!busy)
				send();
		}
	});
	$('new-chat').addEventListener('click', newConversation);
	$('banner-retry').addEventListener('click', checkDaemon);
	$('system').addEventListener('input', systemSize);
	systemSize();
	redraw();
	checkDaemon();
	/* for tests and the curious: what the page knows, without the secret */
	window.tokiWeb = {turns, conversation, isUp: () => daemonUp};
})();
