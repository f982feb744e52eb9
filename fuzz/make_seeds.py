#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/ (checked in; rerun only to
regenerate). Real examples where there are any: SSE captured from llama-server
build 11669 (fuzz/captures/*.sse, stories260K), request shapes Claude Code,
Codex and OpenAI clients send, the stories260K GGUF header, real slot-file
sidecars. Every seed stays under 64 KB.

  fuzz/make_seeds.py [--gguf ../shared/models/stories260K.gguf]
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")
CAP = os.path.join(HERE, "captures")
LIMIT = 64 * 1024


def put(target, name, data):
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, (dict, list)):
        data = json.dumps(data).encode()
    assert len(data) < LIMIT, (target, name, len(data))
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


TOKEN = "toki-test-token-0123456789abcdef"

# ---------------------------------------------------------------- HTTP heads
heads = {
    "python_post": "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8787\r\n"
                   "Accept-Encoding: identity\r\nContent-Length: 83\r\nContent-Type: "
                   "application/json\r\nAuthorization: Bearer " + TOKEN + "\r\n\r\n",
    "curl_get": "GET /v1/models HTTP/1.1\r\nHost: localhost:8787\r\nUser-Agent: curl/7.88.1\r\n"
                "Accept: */*\r\nx-api-key: " + TOKEN + "\r\n\r\n",
    "anthropic_sdk": "POST /v1/messages?beta=true HTTP/1.1\r\nhost: 127.0.0.1:8787\r\n"
                     "connection: keep-alive\r\nAccept: application/json\r\n"
                     "X-Stainless-Retry-Count: 0\r\nanthropic-version: 2023-06-01\r\n"
                     "anthropic-beta: claude-code-20250219,interleaved-thinking-2025-05-14\r\n"
                     "content-type: application/json\r\nx-api-key: " + TOKEN + "\r\n"
                     "content-length: 5120\r\nExpect: 100-continue\r\n\r\n",
    "chunked": "POST /v1/responses HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               "Authorization: Bearer abc\r\n\r\n",
    "http10_lf": "GET /health HTTP/1.0\n\n",
    "options": "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    "slots_action": "POST /slots/0?action=save HTTP/1.1\r\nHost: x\r\nContent-Length: 24\r\n"
                    "Connection: close\r\n\r\n",
    "leading_crlf": "\r\n\r\nGET /props HTTP/1.1\r\nHost: x\r\nX-Empty:\r\nX-Tab:\tv\t\r\n\r\n",
    "bad_version": "GET / HTTP/2.0\r\n\r\n",
    "folded": "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n",
}
for k, v in heads.items():
    put("http_head", k, v)
put("http_head", "many_headers",
    "GET / HTTP/1.1\r\n" + "".join(f"X-H{i}: {i}\r\n" for i in range(101)) + "\r\n")

# ---------------------------------------------------------------- chunked bodies
def chunked(parts, ext=False, trailer=""):
    out = ""
    for p in parts:
        out += format(len(p), "x") + (";name=v" if ext else "") + "\r\n" + p + "\r\n"
    return out + "0\r\n" + trailer + "\r\n"

body = json.dumps({"messages": [{"role": "user", "content": "Hello there"}], "stream": True})
# Byte 0 picks the body limit, byte 1 the number of cut points that follow.
put("http_chunked", "simple", b"\x04\x03\x05\x01\x09" + chunked([body[:20], body[20:]]).encode())
put("http_chunked", "ext_trailer", b"\x05\x00" + chunked(["abc", "defgh"], ext=True,
                                                           trailer="X-T: 1\r\n").encode())
put("http_chunked", "lf_only", b"\x04\x02\x01\x02" + b"3\nabc\n0\n\n")
put("http_chunked", "over_limit", b"\x02\x00" + chunked(["0123456789"]).encode())
put("http_chunked", "huge_size", b"\x06\x00" + b"ffffffffffffffff\r\nab\r\n0\r\n\r\n")
put("http_chunked", "upper_hex", b"\x04\x00" + b"A\r\n0123456789\r\n0\r\n\r\n")

# ---------------------------------------------------------------- SSE
def sse(chunks):
    return "".join("data: " + (c if isinstance(c, str) else json.dumps(c)) + "\n\n"
                   for c in chunks)

def chunk(delta=None, finish=None, extra=None, cid="chatcmpl-abc123"):
    c = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta or {}}],
         "created": 1795984668, "id": cid, "model": "m.gguf",
         "system_fingerprint": "b11669-Debian", "object": "chat.completion.chunk"}
    if extra:
        c.update(extra)
    return c

timings = {"cache_n": 11, "prompt_n": 31, "prompt_ms": 3.3, "prompt_per_token_ms": 0.1,
           "prompt_per_second": 9368.38, "predicted_n": 6, "predicted_ms": 76.6,
           "predicted_per_token_ms": 15.3, "predicted_per_second": 65.2}
synthetic = {
    "tools": sse([
        chunk({"role": "assistant", "content": None}),
        chunk({"reasoning_content": "Let me think"}),
        chunk({"reasoning_content": " about it."}),
        chunk({"content": "I will call a tool."}),
        chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "Read", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"file_path\": "}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"/tmp/x\"}"}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                               "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}}]}),
        chunk(finish="tool_calls", extra={"timings": timings,
              "usage": {"completion_tokens": 6, "prompt_tokens": 42, "total_tokens": 48}}),
        "[DONE]"]),
    "error_mid": sse([chunk({"role": "assistant", "content": None}), chunk({"content": "Hi"}),
                      {"error": {"code": 500, "message": "slot died", "type": "server_error"}}]),
    "stop_word": sse([chunk({"content": "a"}),
                      chunk(finish="stop", extra={"stopping_word": "</s>", "timings": timings}),
                      "[DONE]"]),
    "progress": sse([chunk(extra={"prompt_progress": {"total": 100, "cache": 0, "processed": 50,
                                                      "time_ms": 3.2}}),
                     chunk({"content": "x"}), chunk(finish="length"),
                     {"choices": [], "usage": {"prompt_tokens": 3}, "timings": timings}, "[DONE]"]),
    "crlf_comments": ": keep-alive\r\n\r\nevent: message\r\ndata: " + json.dumps(chunk({"content": "y"}))
                     + "\r\nid: 7\r\nretry: 10\r\n\r\ndata:\r\ndata: [DONE]\r\n\r\n",
    "multiline_data": "data: {\"choices\":\ndata: []}\n\ndata\n\n\r\r",
}

# Captured from llama-server (see fuzz/captures/).
captures = {}
if os.path.isdir(CAP):
    for f in sorted(os.listdir(CAP)):
        if f.endswith(".sse"):
            data = open(os.path.join(CAP, f), "rb").read()[:LIMIT - 64]
            captures[f[:-4]] = data

for k, v in list(captures.items()) + [(k, v.encode()) for k, v in synthetic.items()]:
    put("sse", k, bytes([len(k) % 48]) + bytes(range(1, 48)) + v)  # cut points, then the stream
    put("anthropic_stream", k, v)

# ---------------------------------------------------------------- Anthropic requests
claude_code = {
    "model": "claude-sonnet-4-20250514", "max_tokens": 32000, "stream": True,
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0.83; cch=ab12;"},
               {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                                     {"type": "text", "text": "List the files",
                                      "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should run ls.", "signature": "sig"},
            {"type": "text", "text": "Running ls."},
            {"type": "tool_use", "id": "toolu_01", "name": "Bash",
             "input": {"command": "ls -la", "timeout": 1.5e3, "flags": [1, 2.5, True, None]}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01",
             "content": [{"type": "text", "text": "a.txt\nb.txt"}]},
            {"type": "tool_result", "tool_use_id": "toolu_02", "content": "plain", "is_error": True},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
            {"type": "document", "source": {}}, {"type": "redacted_thinking", "data": "zz"},
            {"type": "text", "text": "thanks"}]},
        {"role": "assistant"}],
    "tools": [{"name": "Bash", "description": "Runs a command",
               "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                                "required": ["command"]}},
              {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "temperature": 1, "top_p": 0.95, "top_k": 40, "stop_sequences": ["\n\nHuman:"],
    "thinking": {"type": "enabled", "budget_tokens": 31999},
    "metadata": {"user_id": "user_abc_account__session_123"},
    "chat_template_kwargs": {"enable_thinking": True},
}
put("anthropic_request", "claude_code", claude_code)
put("anthropic_request", "minimal", {"model": "m", "max_tokens": 16,
                                     "messages": [{"role": "user", "content": "Hello"}]})
put("anthropic_request", "count_tokens", {"model": "m", "system": "Be brief.",
                                          "messages": [{"role": "user", "content": "Hi"}],
                                          "tools": [{"name": "t", "input_schema": {}}],
                                          "tool_choice": {"type": "tool", "name": "t"}})
put("anthropic_request", "tool_choice_any", {"messages": [], "tool_choice": {"type": "any"},
                                             "system": "", "thinking": {"type": "disabled"}})
put("anthropic_request", "tool_choice_none", {"messages": [{"role": "user", "content": []}],
                                              "tool_choice": {"type": "none"}, "stream": False,
                                              "max_tokens": None})
put("anthropic_request", "wrong_types", {"messages": [{"role": "user", "content": 5}],
                                         "system": 3, "max_tokens": "9"})
put("anthropic_request", "deep", '{"messages":[{"role":"user","content":[{"type":"tool_result",'
    '"content":[{"type":"text","text":"' + "a" * 100 + '"}],"tool_use_id":"x"}]}],'
    '"tools":[{"name":"n","input_schema":{"a":[[[[[[1.0e-5,0.1,1e300,-0.0]]]]]]}}]}')
put("anthropic_request", "openai_chat", {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                         "stream": True, "max_tokens": 5, "temperature": 0,
                                         "id_slot": 1, "n_predict": 4})
put("anthropic_request", "completion", {"prompt": [1, 2, 3, "x"], "max_tokens": 3})

# ---------------------------------------------------------------- Responses requests
codex = {
    "model": "gpt-5-codex", "instructions": "You are Codex, a coding agent.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "env"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix bug"},
                                                        {"type": "input_image", "image_url": "data:x"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}],
         "content": [{"type": "reasoning_text", "text": "thinking hard"}], "encrypted_content": None},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
        {"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"ls\"]}",
         "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
        {"role": "user", "content": "and now?"}],
    "tools": [{"type": "function", "name": "shell", "description": "run",
               "strict": False, "parameters": {"type": "object", "properties": {}}}],
    "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium"},
    "store": False, "stream": True, "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "abc",
}
put("responses_request", "codex", codex)
put("responses_request", "codex_plain", dict(codex, input=[i for i in codex["input"]
                                                           if i.get("type") != "reasoning"]))
put("responses_request", "string_input", {"model": "m", "input": "Hello", "max_output_tokens": 9})
put("responses_request", "prev_id", {"input": "x", "previous_response_id": "resp_1"})
put("responses_request", "bad_item", {"input": [{"type": "nope"}, 5, None]})
put("responses_request", "function_output_obj", {"input": [
    {"type": "function_call_output", "call_id": "c", "output": {"a": 1}},
    {"type": "function_call", "name": "f", "arguments": {"x": 1}, "call_id": "c"}],
    "instructions": 7})

# ---------------------------------------------------------------- GGUF
def gguf_seeds(path):
    data = open(path, "rb").read()
    # Walk the header to find where metadata and tensor infos end.
    pos = 4 + 4
    n_tensors, n_kv = struct.unpack_from("<QQ", data, pos)
    pos += 16
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def read_str(p):
        n = struct.unpack_from("<Q", data, p)[0]
        return p + 8 + n

    def read_val(p, t):
        if t == 8:
            return read_str(p)
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, p)
            p += 12
            for _ in range(n):
                p = read_val(p, et)
            return p
        return p + sizes[t]

    kv_start = pos
    big_kv = []
    for _ in range(n_kv):
        k0 = pos
        pos = read_str(pos)
        t = struct.unpack_from("<I", data, pos)[0]
        pos = read_val(pos + 4, t)
        big_kv.append((k0, pos))
    kv_end = pos
    for _ in range(n_tensors):
        pos = read_str(pos)
        nd = struct.unpack_from("<I", data, pos)[0]
        pos += 4 + 8 * nd + 4 + 8
    infos_end = pos
    hdr = data[:4 + 4]
    # Metadata without the big arrays (the vocabulary), so that seeds stay small.
    small_kvs = [data[a:b] for a, b in big_kv if b - a < 2048]
    meta = b"".join(small_kvs)
    put("gguf", "stories260K_no_tensors", hdr + struct.pack("<QQ", 0, len(small_kvs)) + meta)
    put("gguf", "stories260K_small_kv_tensors",
        hdr + struct.pack("<QQ", n_tensors, len(small_kvs)) + meta + data[kv_end:infos_end])
    if infos_end < LIMIT:
        put("gguf", "stories260K_header", data[:infos_end])
    if kv_end - kv_start < LIMIT:
        put("gguf", "stories260K_all_kv", hdr + struct.pack("<QQ", 0, n_kv) + data[kv_start:kv_end])
    put("gguf", "empty_v3", b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    put("gguf", "v2_truncated", b"GGUF" + struct.pack("<IQQ", 2, 1, 1) + b"\x05\x00")

gguf_path = None
if "--gguf" in sys.argv:
    gguf_path = sys.argv[sys.argv.index("--gguf") + 1]
else:
    cand = os.path.join(HERE, "..", "..", "shared", "models", "stories260K.gguf")
    gguf_path = cand if os.path.exists(cand) else None
if gguf_path:
    gguf_seeds(gguf_path)

# ---------------------------------------------------------------- registry
put("registry", "readme", """models:
  qwen3-4b:
    path: /home/u/.local/state/tokirecur/models/qwen3-4b/Qwen3-4B-Q4_K_M.gguf
    repo: Qwen/Qwen3-4B-GGUF
    file: Qwen3-4B-Q4_K_M.gguf
    binary: /opt/llama/bin/llama-server   # optional: any llama-server
    ctx: 16384                            # optional: the context asked for
    max_output: 4096                      # optional: caps every request's max_tokens
    args: ["-ngl", "99"]                  # optional: extra llama-server arguments
active: qwen3-4b
""")
put("registry", "written", 'models:\n  a:\n    path: "/m/a.gguf"\n    args: ["--jinja", "null", ""]\n'
    '  b.c_d-1:\n    path: "yes"\n    repo: ""\n    ctx: 512\n  "0.5":\n    path: \'~\'\nactive: a\n')
put("registry", "empty_models", "models:\nactive: ~\n")
put("registry", "comments_only", "# nothing yet\n")
put("registry", "flow", '{models: {x: {path: "/p", args: [a, "b", \'c\']}}, active: x}\n')
put("registry", "anchors", "models:\n  a: &m {path: /p}\n  b: *m\n")
put("registry", "two_docs", "models: {}\n---\nmodels: {}\n")
put("registry", "bad_name", "models:\n  ../x:\n    path: /p\n")
put("registry", "escapes", 'models:\n  u:\n    path: "/p/\\u00e9\\t\\x41\\0"\n    file: |\n      multi\n      line\n')

# ---------------------------------------------------------------- slot index
sidecar = {"version": 1,
           "fingerprint": "cf332ffab67a651890281bcc70cd9a5d3c44bf8846615f3e43f701abff238e4c",
           "xxh128": "e69bdce20ae9f777d6c8c2aab238be43", "bytes": 4058184, "n_tokens": 0,
           "aligned": 3584, "hits": 1, "tokens": [], "compressed": False}
real = sorted(f for f in os.listdir(os.path.join(HERE, "captures"))
              if f.endswith(".json")) if os.path.isdir(CAP) else []
for f in real:
    put("slot_index", "real-" + f.split("-")[1], open(os.path.join(CAP, f), "rb").read())
for name, toks, aligned in (("short", [1, 3, 1784, 15, 1805, 384, 955], 0),
                            ("aligned_past_end", list(range(1, 80)), 1 << 40),
                            ("negative", [-1, 2147483647, -2147483648, 5], -3)):
    s = dict(sidecar, tokens=toks, n_tokens=len(toks), aligned=aligned)
    put("slot_index", name, s)
put("slot_index", "other_fingerprint", dict(sidecar, fingerprint="5bf6", tokens=[1, 2],
                                             n_tokens=2))
put("slot_index", "compressed", dict(sidecar, tokens=[1] * 600, n_tokens=600, aligned=512,
                                      compressed=True, bytes=0, hits=4294967296))
# ------------------------------------------------------------ chat templates
# First byte even: the rest is a template (this project's test templates and
# the real ones in tests/templates/); odd: a chat request for the fixed
# template (the corpus test_chat_template.py sends llama-server).
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import chat_corpus  # noqa: E402
import tokenizer_corpus  # noqa: E402
TEMPLATES = os.path.join(HERE, "..", "tests", "templates")
for f in sorted(os.listdir(TEMPLATES)):
    if f.endswith(".jinja"):
        put("chat_template", "tmpl-" + f[:-6], b"\x00" + open(os.path.join(TEMPLATES, f), "rb").read())
put("chat_template", "tmpl-chatml", b"\x00{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    b"{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    b"{% endif %}")
for i, req in enumerate(chat_corpus.corpus(n_random=10)):
    put("chat_template", f"req-{i:02d}", bytes([1 + 2 * (i % 64)]) + json.dumps(req).encode())

# ------------------------------------------------------------ tokenizer
# First byte: the pre-tokenizer (low 7 bits, modulo the target's list) and
# parse_special (high bit); the rest is the text.
for i, text in enumerate(tokenizer_corpus.FIXED):
    put("tokenize", f"fixed-{i:02d}", bytes([(i % 16) | (0x80 if i % 3 == 0 else 0)]) + text.encode())
print("seeds written to", OUT)
