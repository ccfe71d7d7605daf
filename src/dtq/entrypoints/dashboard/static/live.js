// dtq dashboard: the job page kept live from its event stream (GET /ui/jobs/{id}/events,
// Server-Sent Events behind the session cookie). Each "update" carries the job's status and
// counts as the server read them and task statuses (all of a drawn job; those that changed of
// a larger one); this script sets them on the elements already drawn (never adds one per task). Only when the stream is
// unavailable does it fall back to re-reading the section every 10 s.
(function () {
  "use strict";
  var POLL_MS = 10000, REFRESH_MS = 5000;
  var first = document.getElementById("graph");
  if (!first || first.dataset.finished === "true") return;
  var source = null, poller = null, refreshed = 0;

  function section() { return document.getElementById("graph"); }

  function paint(el, status) { // the element's st-<status> class (its colour)
    Array.prototype.slice.call(el.classList).forEach(function (c) {
      if (c.indexOf("st-") === 0) el.classList.remove(c);
    });
    el.classList.add("st-" + status);
  }

  function reread() { // the section as the server renders it (same page of tasks)
    var g = section();
    if (g && window.htmx) htmx.ajax("GET", g.getAttribute("hx-get"), { target: "#graph", swap: "outerHTML" });
  }

  function apply(u) {
    var g = section();
    if (!g) return;
    g.dataset.jobStatus = u.job_status;
    var badge = document.getElementById("job-status");
    badge.textContent = u.job_status;
    paint(badge, u.job_status);
    var bar = document.getElementById("progress");
    bar.textContent = "";
    Object.keys(u.counts).forEach(function (s) {
      var n = u.counts[s], count = g.querySelector('[data-count="' + s + '"] .n');
      if (count) count.textContent = n;
      if (!n) return;
      var part = document.createElement("span");
      part.className = "st-" + s;
      part.style.width = (100 * n / u.total) + "%";
      part.title = s + ": " + n;
      bar.appendChild(part);
    });
    Object.keys(u.tasks).forEach(function (id) {
      var s = u.tasks[id];
      g.querySelectorAll('[data-id="' + id + '"]').forEach(function (el) {
        el.dataset.status = s;
        var mark = el.querySelector(".badge") || el, title = el.querySelector("title");
        if (mark !== el) mark.textContent = s;
        paint(mark, s);
        if (title) title.textContent = title.textContent.replace(/: [a-z]+$/, ": " + s);
      });
    });
    if (u.more && g.querySelector("table[data-tasks]") && Date.now() - refreshed > REFRESH_MS) {
      refreshed = Date.now(); // more changed than one update names: re-read the rows shown
      reread();
    }
    if (u.finished) {
      if (g.querySelector("table[data-tasks]")) reread(); // its rows, once: events lag the counts
      g.dataset.finished = "true";
      var cancel = document.getElementById("cancel-job"), live = document.getElementById("live");
      if (cancel) cancel.remove();
      if (live) live.remove();
      if (source) source.close();
    }
  }

  function poll() { // the fallback: only while there is no stream
    if (poller) return;
    poller = setInterval(function () {
      var g = section();
      if (!g || g.dataset.finished === "true") { clearInterval(poller); return; }
      reread();
    }, POLL_MS);
  }

  if (!window.EventSource) { poll(); return; }
  source = new EventSource(first.dataset.stream);
  source.addEventListener("update", function (e) { apply(JSON.parse(e.data)); });
  source.onerror = function () { // CONNECTING: it reconnects with Last-Event-ID by itself
    if (source.readyState === EventSource.CLOSED) poll();
  };
})();
