// The isosweep dashboard's script. The pages are complete without it (rendered on the server,
// each plot an image); it adds: the interactive charts (each figure[data-chart] fetches its plot's
// JSON and static/charts.js draws it with the vendored uPlot; a refused plot shows the server's
// message), following a running sweep's event stream (GET /sweeps/{id}/events) — or, where there
// is no stream, polling the JSON API while something runs — and swapping the page's live parts in
// place, charts re-drawn in place as results arrive, the cancel button, and greying out plot
// options the kind ignores. Nothing from other hosts.
"use strict";

(function () {
  const POLL_MS = 2000; // while a sweep or trial on the page is queued or running
  const IDLE_POLL_MS = 10000; // the sweeps list, so that new submissions appear
  const PLOT_EVERY_MS = 6000; // re-draw plots at most this often while results stream in
  const body = document.body;
  let version = null; // what the last poll saw; a change re-renders the live parts
  let timer = null;
  let failures = 0;
  let plotsAt = 0;

  // --- polling ---------------------------------------------------------------------------------

  function active() {
    return document.querySelector("[data-live][data-active='true']") !== null;
  }

  function setNote(text) {
    const note = document.getElementById("live-note");
    if (note) note.textContent = text;
  }

  // The fields of the API's answer that change what the page shows (not the ETA's ticking).
  function versionOf(data) {
    const items = Array.isArray(data.data) ? data.data : [data];
    const keys = items.map((x) => [
      x.id, x.status, x.counts, x.progress, x.cancel_requested, x.epochs_done, x.last_epoch,
      x.attempts, x.error,
    ]);
    return JSON.stringify([data.count, keys]);
  }

  async function poll() {
    timer = null;
    if (!document.hidden) {
      try {
        const r = await fetch(body.dataset.poll, {
          headers: { Accept: "application/json" },
          cache: "no-store",
        });
        if (!r.ok) throw new Error("HTTP " + r.status);
        const seen = versionOf(await r.json());
        if (seen !== version) await refresh(version === null);
        version = seen;
        failures = 0;
        setNote(active() ? "live" : "");
      } catch (e) {
        failures += 1;
        setNote("cannot reach the server; retrying…");
      }
    }
    schedule();
  }

  function schedule() {
    if (timer !== null) clearTimeout(timer);
    timer = null;
    if (!body.dataset.poll || stream !== null) return; // the stream tells of every change
    if (active() || failures) {
      timer = setTimeout(poll, POLL_MS * Math.min(1 + failures, 5));
    } else if (body.dataset.page === "index") {
      timer = setTimeout(poll, IDLE_POLL_MS);
    }
  }

  // Fetch this page again and put its fresh live parts where the old ones are.
  async function refresh(first) {
    const r = await fetch(location.href, { headers: { Accept: "text/html" }, cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    for (const old of document.querySelectorAll("[data-live]")) {
      const fresh = old.id ? doc.getElementById(old.id) : null;
      if (fresh) old.replaceWith(document.importNode(fresh, true));
    }
    const cancel = document.getElementById("cancel");
    if (cancel && !active()) cancel.hidden = true;
    const now = Date.now();
    if (!first && (now - plotsAt > PLOT_EVERY_MS || !active())) {
      plotsAt = now;
      document.querySelectorAll("img[data-plot]").forEach(reloadPlot);
      await Promise.all([...document.querySelectorAll("figure[data-chart]")].map(loadChart));
    }
  }

  // --- the event stream ------------------------------------------------------------------------
  // A running sweep's page (data-events) follows GET /sweeps/{id}/events instead of polling:
  // each `progress` that changes what the page shows and each `trial` re-renders the live parts
  // (one refresh at a time; events that arrive meanwhile make one more), `end` re-renders them a
  // last time and closes the stream. If the stream cannot be opened or breaks (a 503 when the
  // server has too many open, a lost connection), the page falls back to polling. The stream is
  // same-origin, so with a token set the session cookie goes along as with every fetch.

  let stream = null;
  let refreshing = false;
  let again = false; // an event arrived during a refresh
  let firstOnly = true; // nothing but the stream's first `progress` seen yet

  async function refreshSoon(first) {
    if (refreshing) {
      again = true;
      return;
    }
    refreshing = true;
    try {
      do {
        again = false;
        await refresh(first);
        first = false;
      } while (again);
      setNote(stream !== null ? "live" : "");
    } catch (e) {
      setNote("cannot reach the server; retrying…");
      if (stream === null) {
        failures += 1;
        schedule();
      }
    } finally {
      refreshing = false;
    }
  }

  function stopStream() {
    if (stream !== null) stream.close();
    stream = null;
  }

  function listen() {
    if (!body.dataset.events || !active() || typeof EventSource !== "function") return false;
    const es = new EventSource(body.dataset.events);
    stream = es;
    es.addEventListener("progress", (event) => {
      const seen = versionOf(JSON.parse(event.data));
      const first = firstOnly;
      firstOnly = false;
      if (seen === version) return;
      version = seen;
      refreshSoon(first); // the first: the page may be older than the stream; no plot re-draw
    });
    es.addEventListener("trial", () => refreshSoon(false));
    es.addEventListener("end", (event) => {
      stopStream();
      version = versionOf(JSON.parse(event.data));
      refreshSoon(false); // no longer active: the plots are re-drawn
    });
    es.addEventListener("error", () => {
      if (stream !== es) return; // closed on purpose
      stopStream();
      setNote("live stream lost; polling");
      schedule(); // active() still: polls every POLL_MS
    });
    setNote("live");
    return true;
  }

  // --- plots -----------------------------------------------------------------------------------

  async function errorText(r) {
    try {
      const data = await r.json();
      return data.error.message;
    } catch (e) {
      return "HTTP " + r.status;
    }
  }

  // img: the plot's <img>, or its chart's <figure>
  function showPlotError(img, text) {
    const figure = img.closest("figure") || img.parentElement;
    const caption = figure.querySelector(".plot-error");
    if (!caption) return;
    caption.textContent = text ? "This plot cannot be drawn: " + text : "";
    caption.hidden = !text;
    img.classList.toggle("broken", Boolean(text));
  }

  // A chart: its JSON fetched (the same route as its image, format=json) and drawn; a refused
  // plot (a 422 naming why) leaves the chart empty and says why under it.
  // A busy server (503, Retry-After) or a plot still being drawn (504: it lands in the cache)
  // is asked again a few times before the chart shows the error.
  const RETRIES = 4;
  async function fetchPatiently(url, options) {
    for (let attempt = 0; ; attempt++) {
      const r = await fetch(url, options);
      if ((r.status !== 503 && r.status !== 504) || attempt >= RETRIES) return r;
      const after = Number(r.headers.get("Retry-After")) || 2;
      await new Promise((done) => setTimeout(done, Math.min(after, 10) * 1000));
    }
  }

  async function loadChart(figure) {
    let r;
    let chart;
    try {
      r = await fetchPatiently(figure.dataset.chart, {
        headers: { Accept: "application/json" },
        cache: "no-store",
      });
      chart = r.ok ? await r.json() : null;
    } catch (e) {
      return showPlotError(figure, "cannot reach the server");
    }
    if (!r.ok) return showPlotError(figure, await errorText(r));
    window.IsosweepCharts.draw(figure, chart);
    showPlotError(figure, "");
  }

  async function explainPlot(img) {
    try {
      const r = await fetch(img.dataset.src, { cache: "no-store" });
      showPlotError(img, r.ok ? "the image did not load" : await errorText(r));
    } catch (e) {
      showPlotError(img, "cannot reach the server");
    }
  }

  // Plot URLs take no cache-busting parameter (the API refuses unknown ones), so fetch the
  // image anew and show it from a blob URL.
  async function reloadPlot(img) {
    try {
      const r = await fetchPatiently(img.dataset.src, { cache: "no-store" });
      if (!r.ok) return showPlotError(img, await errorText(r));
      const old = img.dataset.blob;
      img.dataset.blob = URL.createObjectURL(await r.blob());
      img.src = img.dataset.blob;
      if (old) URL.revokeObjectURL(old);
      showPlotError(img, "");
    } catch (e) {
      /* the next refresh tries again */
    }
  }

  function setupPlots() {
    for (const img of document.querySelectorAll("img[data-plot]")) {
      img.dataset.src = img.getAttribute("src");
      img.addEventListener("error", () => explainPlot(img));
      img.addEventListener("load", () => showPlotError(img, ""));
      if (img.complete && img.naturalWidth === 0) explainPlot(img);
    }
  }

  function setupPlotForm() {
    const kind = document.querySelector("select[data-kind]");
    if (!kind) return;
    const update = () => {
      const takes = (kind.selectedOptions[0].dataset.takes || "").split(" ");
      for (const label of document.querySelectorAll(".plot-form [data-opt]")) {
        const on = takes.includes(label.dataset.opt);
        label.classList.toggle("off", !on);
        for (const el of label.querySelectorAll("input, select")) el.disabled = !on;
      }
    };
    kind.addEventListener("change", update);
    update();
  }

  // --- cancel ----------------------------------------------------------------------------------

  function setupCancel() {
    const form = document.getElementById("cancel");
    if (!form) return;
    const token = form.querySelector("input[name=token]");
    const message = form.querySelector(".cancel-msg");
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (!window.confirm("Cancel this sweep? Its stored results stay.")) return;
      // Logged in, the session cookie goes along (same origin); otherwise (reads open to
      // all) the token typed here, which is kept nowhere.
      const headers = {};
      if (token) headers.Authorization = "Bearer " + token.value;
      message.classList.remove("error");
      try {
        const r = await fetch(form.action, {
          method: "POST",
          headers: headers,
          credentials: "same-origin",
        });
        if (!r.ok) {
          message.textContent = await errorText(r);
          message.classList.add("error");
          return;
        }
        message.textContent = "cancel requested";
        form.querySelector("button").disabled = true;
        version = null;
        await refresh(false);
        schedule();
      } catch (e) {
        message.textContent = "cannot reach the server";
        message.classList.add("error");
      }
    });
  }

  setupPlots();
  document.querySelectorAll("figure[data-chart]").forEach(loadChart);
  setupPlotForm();
  setupCancel();
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer !== null) {
      clearTimeout(timer);
      poll();
    }
  });
  if (!listen()) {
    if (body.dataset.poll && active()) setNote("live");
    schedule();
  }
})();
