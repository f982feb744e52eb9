"""The interleaved agent workload of benchmarks b and c.

Three agent sessions (like three coding-agent windows open at once). Each has
a long system prompt (a base shared by all sessions, as tool definitions are,
plus a session-specific part: 1-3k tokens in all), five turns that grow the
conversation (the user message plus the previous assistant reply fed back),
a sub-agent with its own long system prompt (two turns; its result is fed to
the main agent's third turn) and a title request ("Write a 5-word title for:
<first user message>", max_tokens 8). The sessions' events are interleaved
with a stagger of one event, as a harness serving three users would send them.

The request list is fixed once, by an uncached run (`cache_prompt: false`) on
its own llama-server: every configuration then replays exactly the same
prompts, the limit is the same for all of them, and the reference replies are
the uncached text that the identity rate compares against."""
import random

from common import (Client, answer_of, harness, header_tokens, log, stream_chat_retrying,
                    tokenize_chat, stop)

WORDS = ("the cat dog sun moon tree bird river house small big red blue green old new happy "
         "sad runs jumps sings walks looks finds makes takes gives tells asks likes file "
         "code test build read write edit search line function value error list path tool "
         "and but then so because when where why how what who").split()

CHARS_PER_TOKEN = 2.75  # the generated models' byte-fallback vocabulary, on this text

FULL = dict(sessions=3, main_turns=5, sub_turns=2, main_base=1100, main_tails=(300, 900, 1700),
            sub_base=700, sub_tails=(400, 700, 1000), max_tokens=32, per_slot_ctx=6144)
QUICK = dict(sessions=3, main_turns=3, sub_turns=2, main_base=500, main_tails=(200, 400, 700),
             sub_base=300, sub_tails=(150, 300, 450), max_tokens=32, per_slot_ctx=3072)


def sentence(rng, lo=5, hi=15):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."


def text_of_tokens(rng, tokens):
    """Random sentences of about `tokens` tokens."""
    out = []
    chars = 0
    while chars < tokens * CHARS_PER_TOKEN:
        s = sentence(rng, 6, 18)
        out.append(s)
        chars += len(s) + 1
    return " ".join(out)


def params(quick):
    return QUICK if quick else FULL


def schedule(p):
    """The order of (session, event) pairs: each session's events are M1, T,
    M2, S1..Sn, M3..Mk; session s starts s events after session 0."""
    events = []
    for s in range(p["sessions"]):
        ev = [("main", 1), ("title", 0), ("main", 2)]
        ev += [("sub", t) for t in range(1, p["sub_turns"] + 1)]
        ev += [("main", t) for t in range(3, p["main_turns"] + 1)]
        for e, what in enumerate(ev):
            events.append((e + s, s, what))
    events.sort()
    return [(s, what) for _, s, what in events]


def build(quick, send, seed=11):
    """Runs the workload once, calling send(messages, max_tokens) -> reply text
    for each request in order. Returns the request list."""
    p = params(quick)
    rng = random.Random(seed)
    main_base = ("You are a coding agent. Tools and rules follow. " +
                 text_of_tokens(rng, p["main_base"]))
    sub_base = ("You are a research sub-agent. Report findings briefly. " +
                text_of_tokens(rng, p["sub_base"]))
    sessions = []
    for s in range(p["sessions"]):
        srng = random.Random(seed * 100 + s)
        sessions.append({
            "system": main_base + "\n\nSession context: " +
                      text_of_tokens(srng, p["main_tails"][s % len(p["main_tails"])]),
            "sub_system": sub_base + "\n\nTask context: " +
                          text_of_tokens(srng, p["sub_tails"][s % len(p["sub_tails"])]),
            "users": [" ".join(sentence(srng) for _ in range(srng.randint(1, 4)))
                      for _ in range(p["main_turns"])],
            "sub_users": [" ".join(sentence(srng) for _ in range(srng.randint(1, 3)))
                          for _ in range(p["sub_turns"])],
            "main": None, "sub": None, "sub_result": "",
        })
    requests = []
    for s, (kind, turn) in schedule(p):
        ss = sessions[s]
        max_tokens = p["max_tokens"]
        if kind == "title":
            msgs = [{"role": "user", "content": "Write a 5-word title for: " + ss["users"][0]}]
            max_tokens = 8
        elif kind == "main":
            if ss["main"] is None:
                ss["main"] = [{"role": "system", "content": ss["system"]}]
            user = ss["users"][turn - 1]
            if turn == 3 and ss["sub_result"]:
                user = "The research agent reported: " + ss["sub_result"] + "\n\n" + user
            msgs = ss["main"] + [{"role": "user", "content": user}]
        else:
            if ss["sub"] is None:
                ss["sub"] = [{"role": "system", "content": ss["sub_system"]}]
            msgs = ss["sub"] + [{"role": "user", "content": ss["sub_users"][turn - 1]}]
        reply = send(msgs, max_tokens)
        if kind == "main":
            ss["main"] = msgs + [{"role": "assistant", "content": reply}]
        elif kind == "sub":
            ss["sub"] = msgs + [{"role": "assistant", "content": reply}]
            ss["sub_result"] = reply
        requests.append({"i": len(requests), "session": s, "kind": kind, "turn": turn,
                         "messages": msgs, "max_tokens": max_tokens, "reply": reply})
    return requests


# Every request asks for the log-probability of each generated token: comparing
# them with the uncached run's, float for float, is a far more sensitive test
# of identical numerics than the text (on a random-weight model the greedy
# text is often one token repeated, which a small numeric difference rarely flips).
LOGPROBS = {"logprobs": True, "top_logprobs": 1}


def body_of(req):
    return dict({"messages": req["messages"], "temperature": 0,
                 "max_tokens": req["max_tokens"]}, **LOGPROBS)


_cache = {}


def reference(quick, model, ubatch=512, requests=None):
    """The uncached run: builds the request list (when `requests` is None) or
    replays a given one, on a 1-slot llama-server with `cache_prompt: false`.
    Returns (requests with reference replies, token lists, seconds)."""
    import time
    key = (quick, model, ubatch, None if requests is None else id(requests))
    if key in _cache:
        return _cache[key]
    th = harness()
    p = params(quick)
    ls = th.LlamaServer(model=model, slots=1, ctx=p["per_slot_ctx"], ubatch=ubatch, cache_ram=0,
                        name=f"bench-ref-ub{ubatch}")
    try:
        c = Client(ls.port)

        lps = []
        ntok = []

        def send(msgs, max_tokens):
            st, r = c.json("POST", "/v1/chat/completions",
                           dict({"messages": msgs, "temperature": 0, "max_tokens": max_tokens,
                                 "cache_prompt": False}, **LOGPROBS))
            if st != 200:
                raise RuntimeError(f"reference request failed: {st} {r}")
            ch = r["choices"][0]
            ntok.append((r.get("usage") or {}).get("completion_tokens"))
            lps.append([t.get("logprob") for t in
                        ((ch.get("logprobs") or {}).get("content") or [])])
            return ch["message"]["content"]

        t0 = time.perf_counter()
        if requests is None:
            reqs = build(quick, send)
        else:
            reqs = [dict(r, reply=send(r["messages"], r["max_tokens"])) for r in requests]
        reqs = [dict(r, reply_logprobs=lp, reply_tokens=nt)
                for r, lp, nt in zip(reqs, lps, ntok)]
        secs = time.perf_counter() - t0
        tokens = [tokenize_chat(c, r["messages"]) for r in reqs]
        for r in reqs:
            r["header_tokens"] = header_tokens(c, r["messages"])
        c.close()
    finally:
        stop(ls)
    log(f"reference run (ub {ubatch}): {len(reqs)} requests, "
        f"{sum(len(t) for t in tokens)} prompt tokens, {secs:.1f} s")
    _cache[key] = (reqs, tokens, secs)
    return _cache[key]


def toki_reference(quick, model, requests, ubatch=512, threads=2):
    """toki's own uncached answers, exact mode's reference: the same request
    list through a fresh toki in exact mode (a 1-slot llama-server, the same
    -ub and the servers' threads, which must be those of the servers
    compared: -t changes the bits) with `cache_prompt: false`, so each prompt
    is evaluated from an empty slot on toki's schedule. The list is fixed, so
    the answers do not depend on history. Sets toki_reply,
    toki_reply_logprobs and toki_ref_cache on each request (in place);
    returns seconds."""
    import time
    if requests and requests[0].get("toki_ref_ub") == ubatch and \
            requests[0].get("toki_ref_threads") == threads:
        return 0.0
    th = harness()
    p = params(quick)
    ls = th.LlamaServer(model=model, slots=1, ctx=p["per_slot_ctx"], ubatch=ubatch, cache_ram=0,
                        threads=threads, name=f"bench-tokiref-ub{ubatch}")
    toki = None
    try:
        toki = th.Toki([ls], mode="exact", ubatch=ubatch, name=f"toki-bench-tokiref-ub{ubatch}")
        c = Client(toki.port)
        t0 = time.perf_counter()
        for r in requests:
            # Streamed, as the answers it is compared with: toki rewrites a
            # non-streamed multi-step answer's numbers (docs/benchmarks.md).
            j = stream_chat_retrying(c, dict(body_of(r), cache_prompt=False))
            if j["status"] != 200:
                raise RuntimeError(f"toki reference request failed: {j}")
            r["toki_reply"], r["toki_reply_logprobs"] = answer_of(j)
            r["toki_ref_cache"] = j.get("cache")
            r["toki_ref_ub"] = ubatch
            r["toki_ref_threads"] = threads
        secs = time.perf_counter() - t0
        c.close()
    finally:
        stop(toki, ls)
    same = sum(r["toki_reply"] == r["reply"] and r["toki_reply_logprobs"] == r["reply_logprobs"]
               for r in requests)
    log(f"toki reference run (ub {ubatch}): {len(requests)} requests, {secs:.1f} s; "
        f"equal to llama-server's uncached answer (text + logprobs): {same}/{len(requests)}")
    return secs
