// latsim's browser viewer: the `latsim client` protocol and records in a web page.
//
// It speaks harness/net/wire.py's protocol with the server that served it: a burst of clock
// probes before the session (the offset of the probe with the smallest round trip is the
// estimate, RTT_min / 2 its bound; one probe every 0.5 s during the session), hello, then it
// plays the slots by the serving model's playout rule with delay D (due at server play time
// + D plus the shift of earlier client stalls; a slot that arrives later than that is shown
// when it arrives, a client stall). A slot's display time is the timestamp of the first
// requestAnimationFrame frame at or after the time the rule shows it, the frame that draws
// it; every frame's timestamp is kept, and the display's refresh period fitted to them
// (refreshClock) goes into config.json as "display" for latsim compare. Conditions come from a key press, the button, or a trace in the URL (?trace=0.5,1.7).
// Every time recorded is stream time on this page's clock (performance.now() seconds minus
// the client time of the server's playback start), as latsim.run.viewer says; when the
// session ends the page writes its summary into #latsim-summary and offers the run folder
// (config.json kind "client" format 2, conditions/slots/stalls/jobs/probes CSVs with the
// simulator's column names and leading policy, K, run columns, trace.jsonl, summary.json)
// for download, and as window.latsimRecords {filename: text}.
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  const EPS = 1e-9; // latsim.controller.machine.EPS
  const FORMAT_VERSION = 2; // latsim.run.folder.CLIENT_FORMAT_VERSION

  function num(name, fallback) {
    const raw = params.get(name);
    if (raw === null || raw === "") return fallback;
    const value = Number(raw);
    if (!Number.isFinite(value)) throw new Error(`URL parameter ${name}=${raw} is not a number`);
    return value;
  }

  const clock = () => performance.now() / 1000; // the client clock (seconds)

  // ------------------------------------------------------------------ configuration

  function readConfig() {
    const traceText = params.get("trace");
    const trace = traceText
      ? traceText.split(",").filter((s) => s.trim() !== "").map(Number)
      : null;
    if (trace && !trace.every((t) => Number.isFinite(t) && t >= 0)) {
      throw new Error("trace must be a comma-separated list of times >= 0 (s)");
    }
    const given = params.get("server");
    const token = params.get("token");
    let url = given || `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/`;
    const shownUrl = url;
    if (token) url += (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token);
    return {
      url, shownUrl,
      trace: trace ? trace.slice().sort((a, b) => a - b) : null,
      traceName: trace ? "url" : "keys",
      duration: num("duration", 60),
      K: Math.round(num("K", 4)),
      policy: params.get("policy") || "speculative",
      D: num("D", num("playout_delay", 0.1)),
      lead: num("lead", null),
      drain: num("drain", null),
      r: params.has("r") ? Math.round(num("r", 4)) : null,
      fps: num("fps", 16),
      probes: Math.round(num("probes", 16)),
      probeEvery: num("probe_every", 0.5),
      endTimeout: num("end_timeout", 60),
      connectTimeout: num("connect_timeout", 10),
    };
  }

  // ------------------------------------------------------------------ clock estimates

  function probeRow(t0, t1, t2, t3) {
    return { t0, t1, t2, t3, rtt: (t3 - t0) - (t2 - t1), offset: ((t1 - t0) + (t2 - t3)) / 2 };
  }

  function estimateOffset(probes) { // harness.net.netclock.estimate_offset
    let best = null;
    for (const p of probes) if (best === null || p.rtt < best.rtt) best = p;
    return best && { offset: best.offset, uncertainty: best.rtt / 2, rtt_min: best.rtt,
                     probes: probes.length, at: best.t0 };
  }

  function estimateDrift(probes, windows = 4) { // harness.net.netclock.estimate_drift
    if (probes.length < 2) return null;
    const ordered = probes.slice().sort((a, b) => a.t0 - b.t0);
    const best = [];
    for (let i = 0; i < windows; i++) {
      const span = ordered.slice(Math.floor(i * ordered.length / windows),
                                 Math.floor((i + 1) * ordered.length / windows));
      if (span.length) best.push(estimateOffset(span));
    }
    if (best.length < 2) return null;
    const xs = best.map((b) => b.at), ys = best.map((b) => b.offset);
    const mx = mean(xs), my = mean(ys);
    let sxx = 0, sxy = 0;
    for (let i = 0; i < xs.length; i++) { sxx += (xs[i] - mx) ** 2; sxy += (xs[i] - mx) * (ys[i] - my); }
    return sxx > 0 ? sxy / sxx : null;
  }

  // ------------------------------------------------------------------ statistics

  function mean(values) { return values.reduce((a, b) => a + b, 0) / values.length; }

  function percentile(sorted, level) { // numpy's default (linear)
    const h = (sorted.length - 1) * level / 100, lo = Math.floor(h), hi = Math.ceil(h);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (h - lo);
  }

  function stats(values, prefix) { // latsim.analysis.serving._latency_stats
    const v = values.filter(Number.isFinite).sort((a, b) => a - b);
    const out = {};
    out[`${prefix}_mean`] = v.length ? mean(v) : null;
    out[`${prefix}_mean_se`] = null;
    if (v.length > 1) {
      const m = mean(v);
      const sd = Math.sqrt(v.reduce((a, x) => a + (x - m) ** 2, 0) / (v.length - 1));
      out[`${prefix}_mean_se`] = sd / Math.sqrt(v.length);
    }
    for (const level of [50, 95, 99]) out[`${prefix}${level}`] = v.length ? percentile(v, level) : null;
    return out;
  }

  const overlap = (start, end, window) => Math.max(0, Math.min(end, window) - Math.max(start, 0));

  // The display's refresh clock, from every requestAnimationFrame timestamp (seconds): frame
  // i is refresh n_i of the session, counted from the frame before by the typical interval
  // (a refresh the page skipped counts), and the period is the least-squares slope of t over
  // n, counted again with it once (latsim.model.display reads the result; docs/live.md).
  function refreshClock(times) {
    if (times.length < 3) return null;
    const deltas = [];
    for (let i = 1; i < times.length; i++) deltas.push(times[i] - times[i - 1]);
    let period = percentile(deltas.slice().sort((a, b) => a - b), 50);
    let fit = null;
    for (let pass = 0; pass < 2 && period > 0; pass++) {
      const n = [0];
      for (let i = 1; i < times.length; i++) {
        n.push(n[i - 1] + Math.max(1, Math.round(deltas[i - 1] / period)));
      }
      const mn = mean(n), mt = mean(times);
      let snn = 0, snt = 0;
      for (let i = 0; i < n.length; i++) {
        snn += (n[i] - mn) ** 2;
        snt += (n[i] - mn) * (times[i] - mt);
      }
      period = snt / snn;
      let sse = 0;
      for (let i = 0; i < n.length; i++) sse += (times[i] - mt - period * (n[i] - mn)) ** 2;
      fit = { period, frames: times.length, refreshes: n[n.length - 1],
              jitter: Math.sqrt(sse / (n.length - 2)) };
    }
    return fit && fit.period > 0 ? fit : null;
  }

  // ------------------------------------------------------------------ the run folder

  const COLUMNS = { // latsim.run.viewer's record types, in column order
    conditions: ["cid", "version", "t_sent", "t_arrival", "job_id", "t_start", "t_ready",
                 "t_play", "t_received", "t_shown", "t_displayed", "R", "C", "Q", "L_server",
                 "L", "superseded", "displayed", "status"],
    slots: ["position", "version", "job_id", "t_start", "t_server_sent", "t_received", "t_due",
            "t_shown", "t_displayed", "bytes", "payload"],
    stalls: ["side", "position", "t_start", "t_end"],
    jobs: ["job_id", "kind", "branch", "length", "version", "t_start", "t_ready",
           "t_gen_start", "t_gen_end"],
    probes: ["t0", "t1", "t2", "t3", "rtt", "offset"],
  };
  const KEYED = ["conditions", "slots", "stalls", "jobs"]; // latsim.run.viewer.KEYED

  function cell(value) { // latsim.run.record_files._cell: NaN is an empty cell
    if (typeof value === "number") return Number.isNaN(value) ? "" : String(value);
    if (typeof value === "boolean") return value ? "True" : "False";
    return String(value);
  }

  function csv(table, rows, keys) { // Python's csv module: \r\n line ends
    const lead = KEYED.includes(table) ? keys : {}; // the leading policy, K, run columns
    const names = COLUMNS[table];
    const row = (r) => [...Object.values(lead), ...names.map((n) => r[n])].map(cell).join(",");
    return [[...Object.keys(lead), ...names].join(","), ...rows.map(row)].join("\r\n") + "\r\n";
  }

  // Python's json.dumps spacing, for trace.jsonl's lines
  const pyJson = (value) => JSON.stringify(value).replace(/,"/g, ', "').replace(/":/g, '": ');

  // ------------------------------------------------------------------ the viewer

  class Viewer {
    constructor(config) {
      this.config = config;
      this.probes = [];
      this.estimate = null;
      this.offset = 0;
      this.origin = 0;
      this.ready = null;
      this.end = null;
      this.stopReason = "";
      this.conditions = [];
      this.resolves = new Map(); // version -> {info, position}
      this.slots = [];
      this.slotAt = new Map(); // position -> slot
      this.toShow = []; // slots not displayed yet, in order
      this.displayed = new Map(); // position -> client time of the frame that drew it
      this.frameTimes = []; // every requestAnimationFrame timestamp (client clock, s)
      this.jobs = [];
      this.stalls = [];
      this.errors = [];
      this.shift = 0; // the playout rule's
      this.lastPlayed = null;
      this.bytes = 0;
      this.early = [];
      this.current = null; // the slot on screen
      this.finished = false;
      this.startedAt = new Date();
      this.timers = [];
    }

    // -------------------------------------------------------------- sending

    send(message) {
      if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
    }

    probe() { this.send({ type: "probe", t0: clock() }); }

    condition() {
      if (!this.ready || this.finished) return;
      const cid = this.conditions.length;
      const sent = clock();
      this.conditions.push({ cid, sent, version: 0, arrival: NaN, refused: false });
      this.send({ type: "condition", cid, sent, session: this.ready.session });
    }

    // -------------------------------------------------------------- receiving

    fromServer(t) { return t - this.offset - this.origin; }
    streamTime(t) { return t - this.origin; }

    onMessage(event) {
      const now = clock();
      if (event.data instanceof ArrayBuffer) {
        if (this.ready) this.slot(event.data, now); else this.early.push([event.data, now]);
        return;
      }
      const m = JSON.parse(event.data);
      switch (m.type) {
        case "probe": this.probes.push(probeRow(m.t0, m.t1, m.t2, now)); break;
        case "ready": this.onReady(m); break;
        case "ack": {
          const c = this.conditions[m.cid];
          if (c) { c.version = m.version; c.arrival = m.arrival; }
          break;
        }
        case "job":
          this.jobs.push({
            job_id: m.job_id, kind: m.kind, branch: m.branch, length: m.length,
            version: m.version, t_start: this.fromServer(m.start),
            t_ready: this.fromServer(m.ready),
            t_gen_start: m.gen_start == null ? NaN : this.fromServer(m.gen_start),
            t_gen_end: m.gen_end == null ? NaN : this.fromServer(m.gen_end),
          });
          break;
        case "error":
          this.errors.push(m.error);
          if (m.cid != null && m.cid < this.conditions.length) this.conditions[m.cid].refused = true;
          if (!this.ready) this.fail(`the server refused the session: ${m.error}`);
          break;
        case "end": this.end = m; this.finishSoon(); break;
        default: this.errors.push(`unknown message type ${String(m.type).slice(0, 40)}`);
      }
    }

    onReady(m) {
      this.origin = m.start - this.offset; // client time of stream time 0
      this.ready = m;
      for (const [data, received] of this.early) this.slot(data, received);
      this.early = [];
      setState("running", "running");
      document.getElementById("condition").disabled = false;
      document.getElementById("stop").disabled = false;
      // the trace's conditions at their stream times, on this clock
      const times = (this.config.trace || []).filter((t) => t < this.config.duration);
      const inject = (i) => {
        if (i >= times.length || this.finished) return;
        const wait = (this.origin + times[i] - clock()) * 1000;
        if (wait > 0) { this.timers.push(setTimeout(() => inject(i), wait)); return; }
        this.condition();
        inject(i + 1);
      };
      inject(0);
      this.timers.push(setInterval(() => this.probe(), this.config.probeEvery * 1000));
      const drain = this.config.drain != null ? this.config.drain : 10 * m.T;
      const limit = this.config.duration + drain + this.config.endTimeout;
      this.timers.push(setTimeout(() => {
        if (!this.end) { this.stopReason = `no end from the server ${limit} s after the start`; this.finishSoon(); }
      }, Math.max(0, (this.origin + limit - clock()) * 1000)));
    }

    slot(data, received) {
      const view = new DataView(data);
      const magic = String.fromCharCode(...new Uint8Array(data, 0, 4));
      if (data.byteLength < 8 || magic !== "LSF1") { this.errors.push("not a slot frame (bad magic)"); return; }
      const length = view.getUint32(4, false);
      const header = JSON.parse(new TextDecoder().decode(new Uint8Array(data, 8, length)));
      const payload = new Uint8Array(data, 8 + length);
      this.bytes += payload.length;
      const played = this.fromServer(header.played);
      const arrives = this.streamTime(received);
      const delta = this.ready.delta;
      if (this.lastPlayed !== null && played - this.lastPlayed > delta + 1e-6) {
        this.stalls.push({ side: "server", position: header.position,
                           t_start: this.lastPlayed + delta, t_end: played });
      }
      this.lastPlayed = played;
      // latsim.controller.playout.ClientPlayout.show
      const due = played + this.config.D + this.shift;
      let shown = due;
      if (arrives > due + EPS) {
        this.shift = arrives - played - this.config.D;
        shown = arrives;
        this.stalls.push({ side: "client", position: header.position, t_start: due, t_end: shown });
      }
      const slot = {
        position: header.position, version: header.version, job_id: header.job_id,
        t_start: played, t_server_sent: this.fromServer(header.sent), t_received: arrives,
        t_due: due, t_shown: shown, t_displayed: NaN, bytes: payload.length,
        payload: header.payload, shape: header.shape, data: payload,
      };
      this.slots.push(slot);
      this.slotAt.set(slot.position, slot);
      this.toShow.push(slot);
      for (const info of header.resolves) {
        this.resolves.set(info.version, { info, position: header.position });
      }
    }

    // -------------------------------------------------------------- display

    frame(timestamp) { // requestAnimationFrame: what this frame draws, and when
      const t = timestamp / 1000;
      this.frameTimes.push(t);
      while (this.toShow.length && this.toShow[0].t_shown + this.origin <= t) {
        const slot = this.toShow.shift();
        this.displayed.set(slot.position, t);
        slot.t_displayed = this.streamTime(t);
        if (this.current) this.current.data = null; // keep only what is on screen
        this.current = slot;
      }
      draw(this.current, this.ready, t - this.origin);
    }

    // -------------------------------------------------------------- records

    conditionRow(c) { // harness.viewer.client._Client._condition_row, latsim.run.viewer.condition_row
      const sent = this.streamTime(c.sent);
      const arrival = Number.isNaN(c.arrival) ? NaN : this.fromServer(c.arrival);
      const resolved = c.version ? this.resolves.get(c.version) : undefined;
      const row = { cid: c.cid, version: c.version, t_sent: sent, t_arrival: arrival, job_id: -1,
                    t_start: NaN, t_ready: NaN, t_play: NaN, t_received: NaN, t_shown: NaN,
                    t_displayed: NaN, R: NaN, C: NaN, Q: NaN, L_server: NaN, L: NaN,
                    superseded: false, displayed: false };
      if (!resolved) {
        row.status = c.refused ? "refused" : c.version ? "censored" : "lost";
        return row;
      }
      const slot = this.slotAt.get(resolved.position);
      const shownAt = this.displayed.get(resolved.position);
      const displayed = shownAt === undefined ? NaN : this.streamTime(shownAt);
      const start = this.fromServer(resolved.info.start), ready = this.fromServer(resolved.info.ready);
      const play = slot.t_start;
      Object.assign(row, {
        job_id: slot.job_id, t_start: start, t_ready: ready, t_play: play,
        t_received: slot.t_received, t_shown: slot.t_shown, t_displayed: displayed,
        R: start - arrival, C: ready - start, Q: play - ready, L_server: play - arrival,
        L: displayed - sent, superseded: slot.version > c.version, displayed: shownAt !== undefined,
        status: shownAt !== undefined ? "shown" : "censored",
      });
      return row;
    }

    metrics(window) { // latsim.analysis.serving.viewer_metrics
      const rows = this.conditions.map((c) => this.conditionRow(c));
      const shown = rows.filter((c) => c.status === "shown");
      const side = (s) => this.stalls.filter((x) => x.side === s)
        .reduce((a, x) => a + overlap(x.t_start, x.t_end, window), 0);
      const server = side("server"), client = side("client");
      const ran = this.jobs.filter((j) => j.kind !== "prebuffer");
      const pct = (x) => (window ? 100 * x / window : 0);
      return {
        n_conditions: rows.length, n_displayed: shown.length,
        n_lost: rows.filter((c) => c.status === "lost" || c.status === "refused").length,
        ...stats(shown.map((c) => c.L), "L"),
        ...stats(shown.map((c) => c.L_server), "L_server"),
        stall_pct: pct(server), client_stall_pct: pct(client),
        viewer_stall_pct: pct(server + client),
        ...stats(rows.map((c) => c.t_arrival - c.t_sent), "uplink"),
        ...stats(this.slots.map((s) => s.t_received - s.t_start), "deliver"),
        ...stats(this.slots.map((s) => s.t_displayed - s.t_shown), "display_lateness"),
        C_mean: ran.length ? mean(ran.map((j) => j.t_ready - j.t_start)) : null,
        n_jobs: ran.length, n_slots: this.slots.length,
        bytes_received: this.slots.reduce((a, s) => a + s.bytes, 0),
      };
    }

    sessionFields() { // harness.viewer.client._Client.session_fields
      const r = this.ready || {};
      return {
        session: r.session ?? null, T: r.T ?? null, delta: r.delta ?? null,
        lead: r.lead ?? null, lead_source: r.lead_source ?? null, bind: r.bind ?? null,
        schedule: r.schedule ?? null, generator: r.generator ?? null,
        server_run: r.server_run ?? null, server_start: r.start ?? null,
        server_downlink: r.downlink ?? null,
        drain: this.config.drain, offset: this.offset,
        offset_uncertainty: this.estimate ? this.estimate.uncertainty : null,
      };
    }

    folder() { // the files `latsim client --out DIR` writes (harness.viewer.client.run_client)
      const config = this.config;
      const complete = this.end && this.end.status === "complete" && !this.stopReason;
      const status = complete ? "complete" : "interrupted";
      const stopReason = this.stopReason || (complete ? "complete"
        : `server: ${(this.end && this.end.stop_reason) || "unknown"}`);
      const rows = this.conditions.map((c) => this.conditionRow(c));
      const endTime = complete
        ? Math.max(config.duration, ...this.slots.map((s) => s.t_shown).filter(Number.isFinite))
        : Math.max(0, ...this.slots.map((s) => s.t_received), ...rows.map((c) => c.t_sent));
      const window = complete ? config.duration : Math.min(config.duration, endTime);
      const final = estimateOffset(this.probes);
      const display = refreshClock(this.frameTimes);
      const summary = {
        status, stop_reason: stopReason, session: this.ready ? this.ready.session : null,
        window_s: window, ...this.metrics(window), display_period: display && display.period,
        offset: this.offset,
        offset_uncertainty: this.estimate ? this.estimate.uncertainty : null,
        offset_final: final ? final.offset : null,
        offset_final_uncertainty: final ? final.uncertainty : null,
        rtt_min: final ? final.rtt_min : null, drift: estimateDrift(this.probes),
        n_probes: this.probes.length, errors: this.errors.slice(0, 20),
        n_errors: this.errors.length, server_summary: this.end ? this.end.summary ?? null : null,
        viewer: "browser",
      };
      const shaped = { delay: 0.0, jitter: 0.0, loss: 0.0 };
      const configJson = {
        format_version: FORMAT_VERSION, kind: "client", status, url: config.shownUrl,
        K: config.K, policy: config.policy, duration: config.duration,
        playout_delay: config.D, r: this.ready ? this.ready.r : config.r, fps: config.fps,
        seed: 0, uplink: shaped, downlink: shaped, trace_name: config.traceName,
        trace_copy: "trace.jsonl", started_at: isoSeconds(this.startedAt),
        viewer: "browser", user_agent: navigator.userAgent, stop_reason: stopReason,
        end_time: endTime, ...this.sessionFields(), display,
      };
      const trace = [pyJson({ meta: { duration: config.duration, source: config.traceName } }),
        ...rows.map((c, i) => pyJson({ t: Math.round(c.t_sent * 1e6) / 1e6, version: i + 1 }))];
      const keys = { policy: config.policy, K: config.K, run: 0 }; // latsim.run.viewer.run_keys
      return {
        summary,
        files: {
          "config.json": JSON.stringify(configJson, null, 2) + "\n",
          "summary.json": JSON.stringify(summary, null, 2) + "\n",
          "trace.jsonl": trace.join("\n") + "\n",
          "conditions.csv": csv("conditions", rows, keys),
          "slots.csv": csv("slots", this.slots, keys),
          "stalls.csv": csv("stalls", this.stalls, keys),
          "jobs.csv": csv("jobs", this.jobs, keys),
          "probes.csv": csv("probes", this.probes, keys),
        },
      };
    }

    // -------------------------------------------------------------- the session

    async run() {
      const config = this.config;
      setState("connecting", "running");
      this.ws = new WebSocket(config.url);
      this.ws.binaryType = "arraybuffer";
      this.ws.onmessage = (e) => {
        try { this.onMessage(e); } catch (err) { this.errors.push(String(err)); }
      };
      this.ws.onclose = (e) => {
        if (!this.end && !this.finished) {
          this.stopReason = this.ready
            ? "connection closed by the server before the session ended"
            : `the connection closed (code ${e.code}${e.reason ? ": " + e.reason : ""})`;
          if (this.ready) this.finishSoon(); else this.fail(this.stopReason);
        }
      };
      await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`cannot connect to ${config.shownUrl}: timed out`)),
                                 config.connectTimeout * 1000);
        this.ws.onopen = () => { clearTimeout(timer); resolve(); };
        this.ws.onerror = () => { clearTimeout(timer); reject(new Error(`cannot connect to ${config.shownUrl} (a token it accepts?)`)); };
      });
      setState("aligning the clock", "running");
      for (let i = 0; i < config.probes; i++) { this.probe(); await sleep(10); }
      const deadline = clock() + 2;
      while (this.probes.length < config.probes && clock() < deadline) await sleep(5);
      if (!this.probes.length) throw new Error(`${config.shownUrl}: no clock probe came back`);
      this.estimate = estimateOffset(this.probes);
      this.offset = this.estimate.offset;
      const hello = { type: "hello", K: config.K, duration: config.duration, policy: config.policy,
                      fps: config.fps };
      if (config.lead != null) hello.lead = config.lead;
      if (config.drain != null) hello.drain = config.drain;
      if (config.r != null) hello.r = config.r;
      this.send(hello);
      setState("waiting for the session", "running");
      const loop = (timestamp) => {
        this.frame(timestamp);
        updateStats(this);
        if (!this.finished) requestAnimationFrame(loop);
      };
      requestAnimationFrame(loop);
      setTimeout(() => { if (!this.ready && !this.finished) this.fail("no answer to hello"); },
                 config.connectTimeout * 1000);
    }

    stop() { this.send({ type: "bye" }); }

    finishSoon() { // let the scheduled displays run, then write the records
      if (this.finishing) return;
      this.finishing = true;
      const last = Math.max(0, ...this.toShow.map((s) => s.t_shown + this.origin));
      const limit = clock() + Math.min(Math.max(0, last - clock()), 2 * this.config.D + 5) + 0.1;
      const wait = () => {
        if (this.toShow.length && clock() < limit) { setTimeout(wait, 20); return; }
        this.finish();
      };
      wait();
    }

    finish() {
      if (this.finished) return;
      this.finished = true;
      for (const t of this.timers) { clearTimeout(t); clearInterval(t); }
      if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.close(1000);
      const { summary, files } = this.folder();
      publish(summary, files, this.ready ? this.ready.session : "no-session");
      updateStats(this);
      setState(summary.status, summary.status);
      document.getElementById("condition").disabled = true;
      document.getElementById("stop").disabled = true;
    }

    fail(reason) {
      if (this.finished) return;
      this.stopReason = reason;
      this.finished = true;
      for (const t of this.timers) { clearTimeout(t); clearInterval(t); }
      if (this.ws) this.ws.close();
      const summary = { status: "failed", stop_reason: reason, errors: this.errors.slice(0, 20),
                        viewer: "browser" };
      publish(summary, null, "failed");
      setState(`failed: ${reason}`, "failed");
    }
  }

  // ------------------------------------------------------------------ the page

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function isoSeconds(date) { // local time, like datetime.now().isoformat(timespec="seconds")
    const pad = (n) => String(n).padStart(2, "0");
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T` +
      `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  }

  function setState(text, cls) {
    const el = document.getElementById("state");
    el.textContent = text;
    el.className = cls;
  }

  const canvas = document.getElementById("screen");
  const ctx = canvas.getContext("2d");
  const scratch = document.createElement("canvas");

  function hue(version) { return (version * 137.508) % 360; }

  function draw(slot, ready, now) {
    const w = canvas.width, h = canvas.height;
    ctx.fillStyle = "#111";
    ctx.fillRect(0, 0, w, h);
    if (!slot) {
      ctx.fillStyle = "#aaa";
      ctx.font = "20px system-ui, sans-serif";
      ctx.fillText(ready ? "buffering…" : "no stream yet", 24, h / 2);
      return;
    }
    if (slot.payload === "pixels" && slot.data && slot.shape.length === 4 && slot.shape[3] === 3) {
      // [frames, height, width, 3] uint8: the slot's frames over its δ seconds
      const [frames, fh, fw] = slot.shape;
      const index = Math.min(frames - 1, Math.max(0, Math.floor((now - slot.t_shown) / ready.delta * frames)));
      if (scratch.width !== fw || scratch.height !== fh) { scratch.width = fw; scratch.height = fh; }
      const image = new ImageData(fw, fh);
      const src = slot.data, base = index * fh * fw * 3;
      for (let i = 0, j = 0; i < fw * fh; i++, j += 3) {
        image.data[4 * i] = src[base + j];
        image.data[4 * i + 1] = src[base + j + 1];
        image.data[4 * i + 2] = src[base + j + 2];
        image.data[4 * i + 3] = 255;
      }
      scratch.getContext("2d").putImageData(image, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(scratch, 0, 0, w, h);
    } else {
      // no pixels (the latent, or none): the version as a colour, the position as a tape
      ctx.fillStyle = `hsl(${hue(slot.version)} 55% 32%)`;
      ctx.fillRect(0, 0, w, h - 60);
      ctx.fillStyle = "#fff";
      ctx.font = "bold 44px system-ui, sans-serif";
      ctx.fillText(`slot ${slot.position}`, 24, 70);
      ctx.font = "28px system-ui, sans-serif";
      ctx.fillText(`version ${slot.version} · job ${slot.job_id}`, 24, 115);
      ctx.font = "16px system-ui, sans-serif";
      ctx.fillText(`${slot.payload} payload, ${slot.bytes} bytes`, 24, 145);
      const K = ready.K, cell = 16;
      for (let i = -18; i <= 18; i++) {
        const p = slot.position + i;
        if (p < 0) continue;
        const x = w / 2 + i * cell;
        ctx.fillStyle = i === 0 ? "#fff" : p % K === 0 ? "#777" : "#444";
        ctx.fillRect(x - cell / 2 + 1, h - 44, cell - 2, i === 0 ? 28 : 20);
      }
      ctx.fillStyle = "#aaa";
      ctx.font = "12px system-ui, sans-serif";
      ctx.fillText(`chunk boundaries every K = ${K} slots`, 24, h - 50);
    }
  }

  const fmt = (x, digits = 3) => (x == null || !Number.isFinite(x) ? "–" : x.toFixed(digits));
  const ms = (x) => (x == null || !Number.isFinite(x) ? "–" : `${(1000 * x).toFixed(1)} ms`);
  let lastStats = 0;

  function updateStats(v) {
    const now = clock();
    if (now - lastStats < 0.1 && !v.finished) return;
    lastStats = now;
    const set = (id, text) => { document.getElementById(id).textContent = text; };
    const rows = v.conditions.map((c) => v.conditionRow(c));
    const shown = rows.filter((c) => c.status === "shown");
    const Ls = shown.map((c) => c.L).sort((a, b) => a - b);
    const client = v.stalls.filter((s) => s.side === "client");
    const server = v.stalls.filter((s) => s.side === "server");
    const seconds = (list) => list.reduce((a, s) => a + s.t_end - s.t_start, 0);
    const final = estimateOffset(v.probes);
    set("s-time", v.ready ? `${fmt(Math.min(now - v.origin, 1e9), 1)} / ${v.config.duration} s` : "–");
    set("s-conditions", `${v.conditions.length} / ${shown.length}`);
    set("s-last", shown.length ? ms(shown[shown.length - 1].L) : "–");
    set("s-L", Ls.length ? `${ms(percentile(Ls, 50))} / ${ms(percentile(Ls, 95))}` : "–");
    set("s-stalls", `${client.length} (${ms(seconds(client))})`);
    set("s-server-stalls", `${server.length} (${ms(seconds(server))})`);
    set("s-offset", v.estimate ? `${fmt(v.offset, 4)} s ± ${ms(v.estimate.uncertainty)}` : "–");
    set("s-bound", v.estimate ? `${ms(final.offset - v.offset)} ± ${ms(final.uncertainty)} `
      + `(${v.probes.length})` : "–");
    set("s-slots", `${v.slots.length} (${(v.bytes / 1e6).toFixed(2)} MB)`);
    set("s-session", v.ready ? v.ready.session : "–");
    set("s-config", `${v.config.K} · ${v.config.policy} · ${v.config.D} s`);
    set("s-lead", v.ready ? ms(v.ready.lead) : "–");
    document.getElementById("s-lead").title = v.ready ? v.ready.lead_source : "";
    document.getElementById("s-session").title = v.ready ? v.ready.session : "";
  }

  // a stored (uncompressed) zip of the run folder, for one download
  const CRC = (() => {
    const table = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      table[n] = c >>> 0;
    }
    return (bytes) => {
      let c = 0xffffffff;
      for (const b of bytes) c = table[(c ^ b) & 0xff] ^ (c >>> 8);
      return (c ^ 0xffffffff) >>> 0;
    };
  })();

  function zip(folder, files) {
    const enc = new TextEncoder();
    const parts = [], central = [];
    let offset = 0;
    for (const [name, text] of Object.entries(files)) {
      const path = enc.encode(`${folder}/${name}`), data = enc.encode(text), crc = CRC(data);
      const local = new DataView(new ArrayBuffer(30));
      local.setUint32(0, 0x04034b50, true); local.setUint16(4, 20, true);
      local.setUint32(14, crc, true); local.setUint32(18, data.length, true);
      local.setUint32(22, data.length, true); local.setUint16(26, path.length, true);
      parts.push(local, path, data);
      const entry = new DataView(new ArrayBuffer(46));
      entry.setUint32(0, 0x02014b50, true); entry.setUint16(4, 20, true); entry.setUint16(6, 20, true);
      entry.setUint32(16, crc, true); entry.setUint32(20, data.length, true);
      entry.setUint32(24, data.length, true); entry.setUint16(28, path.length, true);
      entry.setUint32(42, offset, true);
      central.push(entry, path);
      offset += 30 + path.length + data.length;
    }
    const size = central.reduce((a, p) => a + p.byteLength, 0);
    const tail = new DataView(new ArrayBuffer(22));
    const count = Object.keys(files).length;
    tail.setUint32(0, 0x06054b50, true); tail.setUint16(8, count, true);
    tail.setUint16(10, count, true); tail.setUint32(12, size, true); tail.setUint32(16, offset, true);
    return new Blob([...parts, ...central, tail], { type: "application/zip" });
  }

  function publish(summary, files, name) {
    document.getElementById("latsim-summary").textContent = JSON.stringify(summary, null, 2);
    window.latsimSummary = summary;
    window.latsimRecords = files;
    const box = document.getElementById("downloads");
    box.textContent = "";
    if (files) {
      const folder = `browser-${name}`;
      const link = (label, blob, filename) => {
        const a = document.createElement("a");
        a.href = URL.createObjectURL(blob);
        a.download = filename;
        a.textContent = label;
        box.appendChild(a);
      };
      link(`download the run folder (${folder}.zip)`, zip(folder, files), `${folder}.zip`);
      for (const [file, text] of Object.entries(files)) {
        link(file, new Blob([text], { type: "text/plain" }), file);
      }
    }
    window.latsimDone = true;
  }

  // ------------------------------------------------------------------ start

  let viewer = null;

  function start() {
    if (viewer) return;
    let config;
    try { config = readConfig(); } catch (err) { setState(`failed: ${err.message}`, "failed"); return; }
    viewer = new Viewer(config);
    window.latsimViewer = viewer;
    document.getElementById("start").disabled = true;
    viewer.run().catch((err) => viewer.fail(err.message || String(err)));
  }

  // a clicked button gives the focus back, so that space is a condition, not a second click
  const button = (id, action) => document.getElementById(id).addEventListener("click", (e) => {
    e.currentTarget.blur();
    action();
  });
  button("start", start);
  button("condition", () => viewer && viewer.condition());
  button("stop", () => viewer && viewer.stop());
  document.addEventListener("keydown", (e) => {
    if (e.repeat || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key === " " || e.key === "Enter") {
      e.preventDefault();
      if (viewer) viewer.condition(); else start();
    }
  });
  draw(null, null, 0);
  if (params.has("trace") || params.get("autostart") === "1") start();
})();
