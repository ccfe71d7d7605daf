// A dtq worker in Node.js (>= 18): built-in fetch, no dependencies. It long-polls the
// orchestrator's HTTP worker protocol, runs a handler per kind, renews each run's lease and
// reports the result or the failure. Run: DTQ_URL=http://127.0.0.1:8080 node worker.mjs
import { hostname } from "node:os";

const url = process.env.DTQ_URL ?? "http://127.0.0.1:8080";
const workerId = process.env.WORKER_ID ?? `node-${hostname()}-${process.pid}`;
const beatEveryMs = Number(process.env.HEARTBEAT_MS ?? 5000); // well under LEASE_DURATION
const leaseMs = Number(process.env.LEASE_MS ?? 30000); // the orchestrator's LEASE_DURATION
const headers = { "content-type": "application/json", "x-worker-id": workerId };
if (process.env.DTQ_TOKEN) headers.authorization = `Bearer ${process.env.DTQ_TOKEN}`;

// kind -> async (payload, task) => result (any JSON value); throwing fails the run
const handlers = {
  "node.echo": async (payload) => payload,
  "node.upper": async (payload, task) =>
    [payload.text, ...Object.values(task.parents)].join(" ").toUpperCase(),
  "node.refuse": async () => { const e = new Error("refused"); e.permanent = true; throw e; },
};

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
// The Python runtime's backoff: 0.5 s doubling up to 2 s, less up to 20 % jitter.
const backoff = (failures) =>
  Math.min(2000, 500 * 2 ** (failures - 1)) * (0.8 + 0.2 * Math.random());

// POST a JSON body; never throws for the network: {status, text}, status 0 when no answer came
// (refused, reset, timed out; `text` says why). A body JSON cannot encode (a BigInt) throws.
async function post(path, body, timeoutMs = 15000) {
  const init = { method: "POST", headers, body: JSON.stringify(body) };
  try {
    const response = await fetch(url + path, { ...init, signal: AbortSignal.timeout(timeoutMs) });
    return { status: response.status, text: await response.text() };
  } catch (err) {
    return { status: 0, text: String(err.cause?.code ?? err.cause?.message ?? err.message ?? err) };
  }
}
// No answer, a 5xx (e.g. the database is down) or a 429: try again later.
const unavailable = ({ status }) => status === 0 || status >= 500 || status === 429;
const why = ({ status, text }) => (status ? `${status} ${text}` : text);

// An error text the API takes (up to 10,000 characters): NUL and lone surrogates escaped.
const lone = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;
const storable = (text) =>
  String(text).replaceAll("\u0000", "\\u0000")
    .replace(lone, (c) => `\\u${c.charCodeAt(0).toString(16)}`).slice(0, 10000) || "error";

// Send a run's report until the orchestrator answers it: no answer, a 5xx or a 429 is sent
// again with backoff while the run may still be ours (its lease renewed within leaseMs and not
// lost); then it is left to be reclaimed. A refusal (4xx) is printed with its JSON error body.
async function report(run, what, body) {
  for (let failures = 1; ; failures++) {
    const sent = await post(`${run.path}/${what}`, body);
    if (!unavailable(sent)) {
      if (sent.status !== 200) console.error(`${run.path}/${what}: ${why(sent)}`);
      return sent;
    }
    if (run.lost || Date.now() - run.renewedAt > leaseMs) {
      console.error(`${run.path}/${what}: ${why(sent)}; not sent again: the lease has lapsed`
        + " and the task will be reclaimed");
      return sent;
    }
    console.error(`${run.path}/${what}: ${why(sent)}; retrying`);
    await sleep(backoff(failures));
  }
}

// Renew the lease every beatEveryMs while the handler runs and its report is being sent; a
// heartbeat without an answer is printed and the next one tries again. 409: the run is lost.
function heartbeat(run) {
  let inFlight = false;
  const beat = async () => {
    if (inFlight || run.lost) return;
    inFlight = true;
    const sent = await post(`${run.path}/heartbeat`, {});
    inFlight = false;
    if (sent.status === 200) run.renewedAt = Date.now();
    else if (sent.status === 409) run.lost = true; // lease_lost: report nothing more
    else console.error(`${run.path}/heartbeat: ${why(sent)}`);
  };
  return setInterval(() => beat().catch((err) => console.error("heartbeat:", err)), beatEveryMs);
}

async function runTask(task) {
  const run = { path: `/v1/worker/runs/${task.run_id}`, renewedAt: Date.now(), lost: false };
  const beat = heartbeat(run);
  try {
    try {
      const result = await handlers[task.kind](task.payload, task);
      const sent = await report(run, "result", { result: result ?? null });
      if (sent.status === 400) { // a result the API cannot store: the run fails, saying why
        const error = storable(`UnstorableResult: ${sent.text}`);
        await report(run, "failure", { error, permanent: true });
      }
    } catch (err) {
      const error = storable(err?.message ?? err);
      await report(run, "failure", { error, permanent: !!err?.permanent });
    }
  } catch (err) { // a bug here must not end the process: the lease lapses, the task reruns
    console.error(`${run.path}: report failed:`, err);
  } finally {
    clearInterval(beat);
  }
}

let stopping = false;
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => { stopping = true; });
console.log(`dtq node worker ${workerId} polling ${url} for ${Object.keys(handlers)}`);
for (let failures = 0; !stopping;) {
  const body = { worker_id: workerId, kinds: Object.keys(handlers), max: 4, wait: "5s" };
  const claimed = await post("/v1/worker/claim", body);
  if (claimed.status === 200) {
    failures = 0;
    let tasks = [];
    try {
      ({ tasks } = JSON.parse(claimed.text));
    } catch (err) { // not the API's answer (a proxy's page?): those runs lapse and rerun
      console.error(`/v1/worker/claim: unreadable answer: ${err.message}`);
    }
    await Promise.all(tasks.map(runTask)); // runTask never rejects
  } else if (claimed.status === 204) {
    failures = 0;
  } else { // no answer, a 5xx, or a refusal (a bad token): say so, try again with backoff
    failures += 1;
    console.error(`/v1/worker/claim: ${why(claimed)}; retrying`);
    await sleep(backoff(failures));
  }
}
// a clean stop: no longer a live worker (claims kept it in the registry); best effort
await post("/v1/worker/registry/remove", { worker_id: workerId });
