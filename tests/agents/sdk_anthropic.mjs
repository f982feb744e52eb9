// One case of the Anthropic SDK against toki's /anthropic routes, chosen by
// argv[2]; prints one JSON line {case, ok, ...} and exits 0 when the case
// behaved as it should. Environment as in sdk_openai.mjs.
import { createRequire } from "node:module";
import { join } from "node:path";

const require = createRequire(join(process.env.TOKI_AGENTS_DIR, "package.json"));
const { Anthropic, AuthenticationError, BadRequestError, APIError } = require("@anthropic-ai/sdk");

const base = process.env.TOKI_ENDPOINT + "/anthropic";
const model = process.env.TOKI_MODEL;
// The token as an API key (x-api-key), or as a bearer token (Authorization).
const client = (key, bearer = false) =>
  new Anthropic(bearer ? { baseURL: base, authToken: key, apiKey: null, maxRetries: 0, timeout: 120000 }
                       : { baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
const messages = [{ role: "user", content: "Say hi." }];

const cases = {
  async nonstream() {
    const r = await client(process.env.TOKI_TOKEN).messages.create({ model, max_tokens: 8, messages });
    const text = r.content.filter((b) => b.type === "text").map((b) => b.text).join("");
    return { ok: r.type === "message" && r.role === "assistant" && r.usage.output_tokens > 0,
             stop_reason: r.stop_reason, text, usage: r.usage };
  },
  async bearer() {
    const r = await client(process.env.TOKI_TOKEN, true).messages.create({ model, max_tokens: 8, messages });
    return { ok: r.type === "message", stop_reason: r.stop_reason };
  },
  async stream() {
    const s = client(process.env.TOKI_TOKEN).messages.stream({ model, max_tokens: 8, messages });
    const types = new Set();
    let text = "";
    s.on("streamEvent", (e) => types.add(e.type));
    s.on("text", (t) => { text += t; });
    const final = await s.finalMessage();
    return { ok: types.has("message_start") && types.has("message_stop") && final.type === "message",
             types: [...types], text, stop_reason: final.stop_reason };
  },
  async count_tokens() {
    const r = await client(process.env.TOKI_TOKEN).messages.countTokens({ model, messages });
    return { ok: Number.isInteger(r.input_tokens) && r.input_tokens > 0, input_tokens: r.input_tokens };
  },
  async bad_request() {
    try {
      await client(process.env.TOKI_TOKEN).messages.create({ model, max_tokens: 8, messages: "hi" });
      return { ok: false, why: "a malformed request was accepted" };
    } catch (e) {
      return { ok: e instanceof BadRequestError && e.status === 400, status: e.status,
               type: e.constructor.name, message: String(e.message).slice(0, 300) };
    }
  },
  async wrong_token() {
    try {
      await client("not-the-token").messages.create({ model, max_tokens: 8, messages });
      return { ok: false, why: "a wrong token was accepted" };
    } catch (e) {
      return { ok: e instanceof AuthenticationError && e.status === 401, status: e.status,
               type: e.constructor.name };
    }
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
