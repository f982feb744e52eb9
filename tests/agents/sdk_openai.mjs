// One case of the OpenAI SDK against toki, chosen by argv[2]; prints one JSON
// line {case, ok, ...} and exits 0 when the case behaved as it should.
//   TOKI_AGENTS_DIR  where scripts/install-test-agents.sh installed the SDKs
//   TOKI_ENDPOINT    toki's base URL (http://127.0.0.1:PORT)
//   TOKI_TOKEN       the local token
//   TOKI_MODEL       the model id (/v1/models data[0].id)
import { createRequire } from "node:module";
import { join } from "node:path";

const require = createRequire(join(process.env.TOKI_AGENTS_DIR, "package.json"));
const { OpenAI, AuthenticationError, BadRequestError, APIError } = require("openai");

const base = process.env.TOKI_ENDPOINT + "/v1";
const model = process.env.TOKI_MODEL;
const client = (apiKey) => new OpenAI({ baseURL: base, apiKey, maxRetries: 0, timeout: 120000 });
const messages = [{ role: "user", content: "Say hi." }];

const cases = {
  async nonstream() {
    const r = await client(process.env.TOKI_TOKEN).chat.completions.create({
      model, messages, max_tokens: 8, temperature: 0,
    });
    const text = r.choices[0].message.content;
    return { ok: typeof text === "string" && r.usage.completion_tokens > 0 && !!r.cache,
             text, usage: r.usage, route: r.cache && r.cache.route };
  },
  async stream() {
    const s = await client(process.env.TOKI_TOKEN).chat.completions.create({
      model, messages, max_tokens: 8, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    });
    let text = "", chunks = 0, finish = null;
    for await (const c of s) {
      chunks++;
      const ch = c.choices && c.choices[0];
      if (ch && ch.delta && ch.delta.content) text += ch.delta.content;
      if (ch && ch.finish_reason) finish = ch.finish_reason;
    }
    return { ok: chunks > 1 && text.length > 0 && finish !== null, chunks, text, finish };
  },
  async responses() {
    const r = await client(process.env.TOKI_TOKEN).responses.create({
      model, input: "Say hi.", max_output_tokens: 8,
    });
    return { ok: r.object === "response" && typeof r.output_text === "string", status: r.status,
             text: r.output_text };
  },
  async responses_stream() {
    const s = await client(process.env.TOKI_TOKEN).responses.create({
      model, input: "Say hi.", max_output_tokens: 8, stream: true,
    });
    const types = new Set();
    let text = "";
    for await (const e of s) {
      types.add(e.type);
      if (e.type === "response.output_text.delta") text += e.delta;
    }
    return { ok: types.has("response.created") && types.has("response.completed") ||
                 types.has("response.incomplete"), types: [...types], text };
  },
  async bad_request() {
    try {
      await client(process.env.TOKI_TOKEN).chat.completions.create({
        model, messages: [{ role: "user", content: 5 }], max_tokens: 8,
      });
      return { ok: false, why: "a malformed request was accepted" };
    } catch (e) {
      return { ok: e instanceof BadRequestError && e.status === 400, status: e.status,
               type: e.constructor.name, message: String(e.message).slice(0, 300) };
    }
  },
  async wrong_token() {
    try {
      await client("not-the-token").chat.completions.create({ model, messages, max_tokens: 8 });
      return { ok: false, why: "a wrong token was accepted" };
    } catch (e) {
      return { ok: e instanceof AuthenticationError && e.status === 401, status: e.status,
               type: e.constructor.name };
    }
  },
  async models() {
    const page = await client(process.env.TOKI_TOKEN).models.list();
    const ids = page.data.map((m) => m.id);
    return { ok: ids.includes(model), ids };
  },
};

const name = process.argv[2];
if (!cases[name]) {
  console.log(JSON.stringify({ case: name, ok: false, why: "no such case", cases: Object.keys(cases) }));
  process.exit(2);
}
try {
  const r = await cases[name]();
  console.log(JSON.stringify({ case: name, ...r }));
  process.exit(r.ok ? 0 : 1);
} catch (e) {
  console.log(JSON.stringify({ case: name, ok: false, status: e instanceof APIError ? e.status : null,
                               type: e.constructor.name, message: String(e.message).slice(0, 500) }));
  process.exit(1);
}
