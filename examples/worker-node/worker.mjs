// A dtq worker in Node.js (>= 18): built-in fetch, no dependencies. It long-polls the
// orchestrator's HTTP worker protocol, runs a handler per kind, renews each run's lease and
// reports the result or the failure. Run: DTQ_URL=http://127.0.0.1:8080 node worker.mjs
import { hostname } from "node:os";

const url = process.env.DTQ_URL ?? "http://127.0.0.1:8080";
const workerId = process.env.WORKER_ID ?? `node-${hostname()}-${process.pid}`;
const beatEveryMs = Number(process.env.HEARTBEAT_MS ?? 5000); // well under LEASE_DURATION
const headers = { "content-type": "application/json", "x-worker-id": workerId };
if (process.env.DTQ_TOKEN) headers.authorization = `Bearer ${process.env.DTQ_TOKEN}`;

// kind -> async (payload, task) => result (any JSON value); throwing fails the run
const handlers = {
  "node.echo": async (payload) => payload,
  "node.upper": async (payload, task) =>
    [payload.text, ...Object.values(task.parents)].join(" ").toUpperCase(),
  "node.refuse": async () => { const e = new Error("refused"); e.permanent = true; throw e; },
};

const post = (path, body) =>
  fetch(url + path, { method: "POST", headers, body: JSON.stringify(body) });

// An error text the API takes (up to 10,000 characters): NUL and lone surrogates escaped.
const lone = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;
const storable = (text) =>
  String(text).replaceAll("\u0000", "\\u0000")
    .replace(lone, (c) => `\\u${c.charCodeAt(0).toString(16)}`).slice(0, 10000) || "error";

// Send a report; say so when the orchestrator refuses it (its answer: a JSON error body).
async function report(path, body) {
  const response = await post(path, body);
  const answer = response.ok ? "" : await response.text();
  if (answer) console.error(`${path}: ${response.status} ${answer}`);
  return { status: response.status, answer };
}

async function run(task) {
  const runUrl = `/v1/worker/runs/${task.run_id}`;
  const beat = setInterval(() => post(`${runUrl}/heartbeat`, {}).catch(() => {}), beatEveryMs);
  try {
    const result = await handlers[task.kind](task.payload, task);
    const sent = await report(`${runUrl}/result`, { result: result ?? null });
    if (sent.status === 400) { // a result the API cannot store: the run fails, saying why
      const error = storable(`UnstorableResult: ${sent.answer}`);
      await report(`${runUrl}/failure`, { error, permanent: true });
    }
  } catch (err) {
    const error = storable(err.message ?? err);
    await report(`${runUrl}/failure`, { error, permanent: !!err.permanent });
  } finally {
    clearInterval(beat);
  }
}

let stopping = false;
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => { stopping = true; });
console.log(`dtq node worker ${workerId} polling ${url} for ${Object.keys(handlers)}`);
while (!stopping) {
  const body = { worker_id: workerId, kinds: Object.keys(handlers), max: 4, wait: "5s" };
  const response = await post("/v1/worker/claim", body).catch((err) => ({ status: 0, err }));
  if (response.status === 200) {
    const { tasks } = await response.json();
    await Promise.all(tasks.map(run));
  } else if (response.status !== 204) {
    console.error(`claim failed: ${response.status || response.err}`);
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}
// a clean stop: no longer a live worker (claims kept it in the registry); best effort
await post("/v1/worker/registry/remove", { worker_id: workerId }).catch(() => {});
