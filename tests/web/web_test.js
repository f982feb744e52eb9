// Drives `toki web` in Debian's headless Chromium with playwright-core (no
// browser download) and writes what it saw as JSON to config.out; the Python test
// (tests/integration/test_web.py) makes the assertions.
//
//   NODE_PATH=<node_modules> node tests/web/web_test.js '<json config>'
//
// config: {scenario: "chat"|"down"|"nokey", out (where the JSON goes),
//          url (the link toki web printed), system,
//          prompts: [[mode, text], ...], screenshot (a path, optional),
//          watch: [strings that must appear in no request or response]}
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const {chromium} = require('playwright-core');

const cfg = JSON.parse(process.argv[2]);
const TURN_TIMEOUT = cfg.turnTimeoutMs || 180000;

// A response's body or headers, or a stand-in if they never come (a body the
// page did not read may never be reported finished).
function settle(promise, fallback, ms = 10000) {
	return Promise.race([promise.catch(() => fallback), new Promise((r) => setTimeout(() => r(fallback), ms).unref())]);
}

function log(...a) {
	process.stderr.write('web_test: ' + a.join(' ') + '\n');
}

async function main() {
	const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'toki-web-chromium-'));
	const out = {scenario: cfg.scenario, network: [], console: [], turns: [], errors: []};
	const context = await chromium.launchPersistentContext(profile, {
		executablePath: cfg.chromium || '/usr/bin/chromium',
		headless: true,
		ignoreHTTPSErrors: true,
		viewport: {width: 1360, height: 900},
		args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
		       '--disable-background-networking', '--disable-component-update', '--disable-sync'],
	});
	try {
		const page = context.pages()[0] || (await context.newPage());
		page.setDefaultTimeout(30000);
		page.on('console', (m) => out.console.push(`${m.type()}: ${m.text()}`));
		page.on('pageerror', (e) => out.errors.push(String(e)));
		// Every request and response the page makes, with headers and bodies.
		const pending = [];
		page.on('request', (req) => {
			pending.push((async () => {
				const entry = {url: req.url(), method: req.method(), headers: await req.allHeaders(), postData: req.postData() || ''};
				out.network.push(entry);
				const resp = await settle(req.response(), null, 300000);
				if (resp) {
					entry.status = resp.status();
					entry.responseHeaders = await settle(resp.allHeaders(), {});
					entry.body = await settle(resp.text(), '<body not seen>', 300000);
				}
			})());
		});

		if (cfg.scenario === 'nokey') {
			// The page without the link's secret: it says what to do.
			await page.goto(cfg.url.replace(/#.*$/, ''));
			await page.waitForSelector('#banner:not([hidden])');
			out.banner = await page.textContent('#banner-text');
			out.apiStatus = await page.evaluate(async () => {
				const r = await fetch('/api/info');
				await r.text();
				return r.status;
			});
		} else {
			await page.goto(cfg.url);
			out.hashAfterLoad = await page.evaluate(() => location.hash);
			out.secureContext = await page.evaluate(() => window.isSecureContext);
			out.protocol = await page.evaluate(() => location.protocol);
			if (cfg.scenario === 'down') {
				await page.waitForSelector('#banner:not([hidden])');
				out.banner = await page.textContent('#banner-text');
				out.dot = await page.getAttribute('#daemon-dot', 'class');
			} else {
				await page.waitForSelector('#daemon-dot.up');
				out.daemonInfo = await page.textContent('#daemon-info');
			}
			if (cfg.scenario === 'models') {
				// The endpoint's models table: each row's cells by key.
				await page.waitForSelector('#models-box:not([hidden]) #models tbody tr');
				out.models = await page.$$eval('#models tbody tr', (rows) => rows.map((r) =>
					Object.fromEntries([...r.querySelectorAll('td')].map((td) => [td.dataset.k, td.textContent]))));
			}
			if (cfg.system != null) {
				await page.click('#system-box summary');
				await page.fill('#system', cfg.system);
				await page.click('#system-box summary'); // folded again: the turns matter
			}
			let k = 0; // the k-th turn shown (a failed turn keeps its article)
			for (const [mode, text] of cfg.prompts || []) {
				k++;
				await page.check('#mode-' + mode);
				await page.fill('#prompt', text);
				await page.click('#send');
				const sel = `#turns article.turn:nth-of-type(${k}):not([data-state="running"])`;
				await page.waitForSelector(sel, {timeout: TURN_TIMEOUT});
				const turn = await page.$eval(sel, (el) => ({
					n: el.dataset.turn,
					mode: el.dataset.mode,
					state: el.dataset.state,
					speedup: (el.querySelector('.speedup') || {}).textContent || '',
					error: (el.querySelector('.error') || {}).textContent || '',
					answers: [...el.querySelectorAll('.answer')].map((a) => {
						const cell = (k) => a.querySelector(`.stats [data-k="${k}"] dd`).textContent;
						return {mode: a.dataset.mode, state: a.dataset.state, text: a.querySelector('.text').textContent,
							route: a.querySelector('.route').hidden ? '' : a.querySelector('.route').textContent,
							ttft: cell('ttft'), evaluated: cell('evaluated'), cached: cell('cached'),
							total: cell('total'), speedup: cell('speedup')};
					}),
				}));
				log(`turn ${turn.n} (${mode}): ${turn.state} ${JSON.stringify(turn.answers.map((a) => [a.mode, a.route, a.ttft, a.evaluated, a.cached]))}`);
				out.turns.push(turn);
			}
			// What the page's own code measured (numbers, not text).
			out.measured = await page.evaluate(() => window.tokiWeb.turns.map((t) => ({
				n: t.n, mode: t.mode, route: t.route,
				raw: t.raw && {ttft: t.raw.ttft, total: t.raw.total, evaluated: t.raw.evaluated, cached: t.raw.cached, reads: t.raw.reads, pieces: t.raw.pieces},
				cached: t.cached && {ttft: t.cached.ttft, total: t.cached.total, evaluated: t.cached.evaluated, cached: t.cached.cached, reads: t.cached.reads, pieces: t.cached.pieces},
			})));
			out.chart = await page.evaluate(() => ({
				raw: [...document.querySelectorAll('#chart circle.pt.pt-raw')].map((c) => [c.dataset.turn, c.dataset.value]),
				cached: [...document.querySelectorAll('#chart circle.pt.pt-cached')].map((c) => [c.dataset.turn, c.dataset.value]),
				lines: document.querySelectorAll('#chart polyline').length,
			}));
			out.summaryRows = await page.$$eval('#summary tbody tr', (rows) => rows.length);
			out.storage = await page.evaluate(() => JSON.stringify(Object.assign({}, sessionStorage, localStorage)));
			out.cookies = await context.cookies();
			out.html = await page.content();
		}
		if (cfg.screenshot) {
			await page.evaluate(() => window.scrollTo(0, 0));
			await page.screenshot({path: cfg.screenshot, fullPage: true});
		}
		await settle(Promise.all(pending), null, 30000);
		out.unseenBodies = out.network.filter((e) => e.body === undefined || e.body === '<body not seen>').map((e) => e.url);
	} finally {
		await context.close();
		fs.rmSync(profile, {recursive: true, force: true});
	}
	// The check the test cares most about: the daemon's token appears nowhere.
	const seen = JSON.stringify(out);
	out.leaks = (cfg.watch || []).filter((s) => s && seen.includes(s));
	// A file rather than stdout: the browser's helpers may keep a pipe open.
	fs.writeFileSync(cfg.out, JSON.stringify(out) + '\n');
}

main().then(() => process.exit(0), (e) => {
	process.stderr.write('web_test: ' + (e && e.stack ? e.stack : String(e)) + '\n');
	process.exit(1);
});
