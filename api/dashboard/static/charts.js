// Interactive charts of the dashboard: a plot's JSON form (GET …/plots/{kind}?format=json,
// api.schemas.ChartPublic; docs/api.md "Plots as JSON") drawn in the browser with the vendored
// uPlot (uPlot.iife.min.js, MIT; uPlot.VERSION). static/dashboard.js fetches the JSON and calls
// IsosweepCharts.draw(figure, chart); nothing here talks to the server.
//
// What a chart keeps from the figure: its numbers (the same series), title, caption, axis labels,
// default scales, bands, and the points an axis cannot show pinned at its edge as the figure pins
// them (service.plots.draw.PINS: ▲ +∞ at the top, ▼ −∞ at the bottom, ✕ NaN just above it, ◆ a
// value ≤ 0 on a log axis at the bottom). What it adds: the nearest point's series, x and y under
// the cursor; a legend entry per series that hides or shows it; drag to zoom, double-click to
// zoom out; a linear/log switch per axis (log refused where the axis has values ≤ 0).
"use strict";

window.IsosweepCharts = (function () {
  const TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf"];
  const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779",
    "#6ece58", "#b5de2b", "#fde725"];
  // A colour's k-th line: solid, then these dashes (service.plots.draw.LINE_STYLES).
  const DASHES = [null, [8, 3, 2, 3], [2, 3], [8, 2, 2, 2, 2, 2], [1, 3], [8, 3]];
  // kind → [where on the y axis (0 bottom, 1 top), glyph, legend text, where]
  const PINS = {
    "+inf": [1, "▲", "= +∞", "top edge"],
    "-inf": [0, "▼", "= −∞", "bottom edge"],
    nan: [0.06, "✕", "= NaN", "bottom"],
    nonpos: [0, "◆", "≤ 0 (log axis)", "bottom edge"],
  };
  const HEIGHT = 340; // px of plot area and axes
  const NEAR = 24; // px: the hover finds the nearest point within this distance
  const MAX_LEGEND = 60; // more series than this: no legend (a parallel-coordinates plot)
  const INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 1e4, 2e4, 5e4, 1e5];

  // --- numbers ---------------------------------------------------------------------------------

  // The API spells NaN and ±∞ as "NaN", "Infinity", "-Infinity": Number() reads them back.
  const num = (v) => (typeof v === "number" ? v : v === null ? NaN : Number(v));
  const isSpelled = (v) => v === "NaN" || v === "Infinity" || v === "-Infinity";

  function fmt(v) {
    if (v === null || v === undefined) return ""; // a tick uPlot leaves unlabelled
    if (Number.isNaN(v)) return "NaN";
    if (v === Infinity) return "+∞";
    if (v === -Infinity) return "−∞";
    return String(Number(v.toPrecision(6)));
  }

  function pinOf(y, ylog) {
    if (Number.isNaN(y)) return "nan";
    if (y === Infinity) return "+inf";
    if (y === -Infinity) return "-inf";
    return ylog && y <= 0 ? "nonpos" : null;
  }

  // --- colours ---------------------------------------------------------------------------------

  function hex(c) {
    return [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16));
  }

  function viridis(t) {
    const u = Math.min(Math.max(t, 0), 1) * (VIRIDIS.length - 1);
    const i = Math.min(Math.floor(u), VIRIDIS.length - 2);
    const [a, b] = [hex(VIRIDIS[i]), hex(VIRIDIS[i + 1])];
    const rgb = a.map((v, k) => Math.round(v + (b[k] - v) * (u - i)));
    return "#" + rgb.map((v) => v.toString(16).padStart(2, "0")).join("");
  }

  function rgba(c, alpha) {
    const [r, g, b] = hex(c);
    return `rgba(${r},${g},${b},${alpha})`;
  }

  function colorOf(chart, s) {
    if (s.color) return s.color;
    if (s.shade !== null && s.shade !== undefined) return viridis(s.shade);
    if (chart.ordered) return viridis(chart.keys > 1 ? (0.9 * s.key) / (chart.keys - 1) : 0);
    return TAB10[s.key % TAB10.length];
  }

  function dashOf(chart, s) {
    if (s.style === "dashed") return [6, 4];
    if (chart.ordered || s.color || (s.shade !== null && s.shade !== undefined)) return null;
    return DASHES[Math.floor(s.key / TAB10.length) % DASHES.length];
  }

  // --- a panel's data --------------------------------------------------------------------------

  // The panel's series with numeric x (a category's text becomes its position, its label a tick)
  // and y, lo, hi as numbers, each with its points in x order.
  function prepare(chart, panel) {
    let ticks = panel.x.ticks;
    const cats = [];
    const isCat = (v) => typeof v === "string" && !isSpelled(v);
    if (!ticks && panel.series.some((s) => s.x.some(isCat))) {
      panel.series.forEach((s) => s.x.forEach((v) => cats.includes(v) || cats.push(v)));
      ticks = cats.map(String);
    }
    const series = panel.series.map((s) => {
      const x = s.x.map((v) => (cats.length ? cats.indexOf(v) : num(v)));
      const order = x.map((_, i) => i).sort((a, b) => x[a] - x[b]);
      return {
        label: s.label, style: s.style, color: colorOf(chart, s), dash: dashOf(chart, s),
        x, y: s.y.map(num), lo: s.lo && s.lo.map(num), hi: s.hi && s.hi.map(num),
        count: s.count, flags: s.flags, order,
      };
    });
    return { series, ticks };
  }

  // Whether an axis may be logarithmic: every finite value positive (or the figure chose log:
  // its values ≤ 0 are pinned at the bottom edge, as the figure pins them).
  function logAllowed(values, axis) {
    if (axis.ticks) return false;
    const finite = values.filter(Number.isFinite);
    return axis.scale === "log" || (finite.length > 0 && finite.every((v) => v > 0));
  }

  function extent(values, log, pad) {
    const v = values.filter((x) => Number.isFinite(x) && (!log || x > 0));
    if (!v.length) return log ? [1, 10] : [0, 1];
    const [lo, hi] = minmax(v);
    if (log) {
      const [a, b] = [Math.log10(lo), Math.log10(hi)];
      const p = Math.max(pad * (b - a), 0.05);
      return [10 ** (a - p), 10 ** (b + p)];
    }
    const span = hi - lo;
    const p = span > 0 ? pad * span : Math.max(0.1 * Math.abs(hi), 0.1);
    return [lo - p, hi + p];
  }

  function minmax(values) {
    let lo = Infinity;
    let hi = -Infinity;
    for (const v of values) {
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    return [lo, hi];
  }

  // Ticks of a log axis from lo to hi: decades; where fewer than two fit, 1-2-5 of each decade;
  // where fewer still, evenly spaced round numbers.
  function logSplits(lo, hi) {
    const [a, b] = [Math.floor(Math.log10(lo)), Math.ceil(Math.log10(hi))];
    const inside = (v) => v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9);
    let out = [];
    for (let k = a; k <= b; k++) out.push(10 ** k);
    out = out.filter(inside);
    if (out.length >= 2) {
      const every = Math.ceil(out.length / 8);
      return out.filter((_, i) => i % every === 0);
    }
    out = [];
    for (let k = a; k <= b; k++) [1, 2, 5].forEach((m) => out.push(m * 10 ** k));
    out = out.filter(inside);
    return out.length >= 2 ? out : linearSplits(lo, hi);
  }

  function linearSplits(lo, hi) {
    const raw = (hi - lo) / 5;
    const p = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
      out.push(Number(v.toPrecision(12)));
    }
    return out;
  }

  // --- one panel as a uPlot ----------------------------------------------------------------------

  function plot(target, chart, panel, state) {
    const P = prepare(chart, panel);
    const xlog = state.xscale === "log";
    const ylog = state.yscale === "log";
    const okX = (v) => Number.isFinite(v) && (!xlog || v > 0);
    const shownY = (v) => Number.isFinite(v) && (!ylog || v > 0);
    const tables = P.series.map((s) => {
      const idx = s.order.filter((i) => okX(s.x[i]));
      if (s.style === "points") {
        const xs = [...new Set(idx.map((i) => s.x[i]))];
        return [xs, xs.map(() => null)]; // drawn by drawOver; here for the legend and x range
      }
      return [idx.map((i) => s.x[i]), idx.map((i) => (shownY(s.y[i]) ? s.y[i] : null))];
    });
    const data = tables.length ? uPlot.join(tables) : [[]];
    const xs = data[0];
    const allX = P.series.flatMap((s) => s.x.filter(okX));
    const padX = P.series.some((s) => s.style === "points" || s.style === "bars") ? 0.04 : 0;
    let full; // the x range zoomed out: the figure's, a category's slots, or the data's
    if (panel.x.range) full = panel.x.range.map(num);
    else if (P.ticks) full = [-0.5, P.ticks.length - 0.5];
    else if (padX) full = extent(allX, xlog, padX); // points and bars: room at the ends
    else full = minmax(allX);
    if (!(full[0] < full[1])) full = extent(allX, xlog, 0.05); // one x value, or none
    const rules = panel.rules || [];

    // y follows what is shown: the visible series' values (and bands) inside the x window
    function yWindow(u, x0, x1) {
      if (panel.y.range) return panel.y.range.map(num);
      const vals = [];
      P.series.forEach((s, k) => {
        if (u && !u.series[k + 1].show) return;
        s.x.forEach((x, i) => {
          if (!(x >= x0 && x <= x1)) return;
          vals.push(s.y[i]);
          if (s.lo) vals.push(s.lo[i], s.hi[i]);
        });
      });
      rules.filter((r) => r.axis === "y").forEach((r) => vals.push(r.value));
      return extent(vals, ylog, 0.05);
    }
    let yWin = yWindow(null, full[0], full[1]);

    const xDistinct = [...new Set(allX)].sort((a, b) => a - b);
    const xAxis = { scale: "x", stroke: "#333", grid: { stroke: "#eee" }, ticks: { stroke: "#ccc" } };
    if (P.ticks) {
      const lines = Math.max(...P.ticks.map((t) => t.split("\n").length));
      xAxis.size = 18 + 16 * lines;
      xAxis.splits = (u, ai, lo, hi) => P.ticks.map((_, i) => i).filter((i) => i >= lo && i <= hi);
      xAxis.values = (u, splits) => splits.map((i) => P.ticks[i]);
    } else if (xlog && xDistinct.length <= 12) {
      xAxis.splits = (u, ai, lo, hi) => xDistinct.filter((v) => v >= lo && v <= hi);
      xAxis.values = (u, splits) => splits.map(fmt);
    } else if (xlog) {
      xAxis.splits = (u, ai, lo, hi) => logSplits(lo, hi);
      xAxis.values = (u, splits) => splits.map(fmt);
    } else if (panel.x.integer) {
      xAxis.incrs = INCRS;
    }
    const yAxis = {
      scale: "y", stroke: "#333", grid: { stroke: "#eee" }, ticks: { stroke: "#ccc" },
      size: (u, values) => 16 + 7 * Math.max(3, ...(values || []).map((v) => String(v).length)),
    };
    if (panel.y.ticks) {
      yAxis.splits = () => panel.y.ticks.map((_, i) => i);
      yAxis.values = (u, splits) => splits.map((i) => panel.y.ticks[i]);
    } else if (ylog) {
      yAxis.splits = (u, ai, lo, hi) => logSplits(lo, hi);
      yAxis.values = (u, splits) => splits.map(fmt);
    }

    const thin = P.series.length > 20; // many lines: 1 px strokes, cheaper to rasterize
    const seriesOpts = P.series.map((s) => {
      const o = { label: s.label, stroke: s.color, width: thin ? 1 : 1.5, spanGaps: false };
      if (s.dash) o.dash = s.dash;
      if (s.style === "step") o.paths = uPlot.paths.stepped({ align: 1 });
      if (s.style === "bars") {
        o.paths = uPlot.paths.bars({ size: [0.6, 80] });
        o.fill = rgba(s.color, 0.8);
        o.points = { show: false };
      }
      if (s.style === "points") {
        o.paths = () => null;
        o.points = { show: false };
        o.fill = s.color; // the legend's marker
      }
      if (s.style === "dashed") o.points = { show: false };
      if (s.style === "line") o.points = { show: (u, si, i0, i1) => i1 - i0 < 60, size: 5 };
      if (state.hidden.has(s.label)) o.show = false;
      return o;
    });

    const pxr = () => window.devicePixelRatio || 1;
    const inPlot = (u, px) => px >= u.bbox.left - 1 && px <= u.bbox.left + u.bbox.width + 1;

    function drawBands(u) {
      const ctx = u.ctx;
      const { left, top, width, height } = u.bbox;
      ctx.save();
      ctx.beginPath();
      ctx.rect(left, top, width, height);
      ctx.clip();
      P.series.forEach((s, k) => {
        if (!s.lo || !u.series[k + 1].show) return;
        const ok = (i) => okX(s.x[i]) && shownY(s.lo[i]) && shownY(s.hi[i]);
        ctx.fillStyle = rgba(s.color, 0.18);
        let run = [];
        const flush = () => {
          if (run.length > 1) {
            ctx.beginPath();
            run.forEach((i, j) => {
              const X = u.valToPos(s.x[i], "x", true);
              const Y = u.valToPos(s.hi[i], "y", true);
              j ? ctx.lineTo(X, Y) : ctx.moveTo(X, Y);
            });
            [...run].reverse().forEach((i) => {
              ctx.lineTo(u.valToPos(s.x[i], "x", true), u.valToPos(s.lo[i], "y", true));
            });
            ctx.closePath();
            ctx.fill();
          }
          run = [];
        };
        s.order.forEach((i) => (ok(i) ? run.push(i) : flush()));
        flush();
      });
      ctx.restore();
    }

    function marker(ctx, kind, X, Y, color) {
      const r = 5 * pxr();
      ctx.beginPath();
      if (kind === "+inf") {
        ctx.moveTo(X, Y - r); ctx.lineTo(X + r, Y + r * 0.7); ctx.lineTo(X - r, Y + r * 0.7);
      } else if (kind === "-inf") {
        ctx.moveTo(X, Y + r); ctx.lineTo(X + r, Y - r * 0.7); ctx.lineTo(X - r, Y - r * 0.7);
      } else if (kind === "nonpos") {
        ctx.moveTo(X, Y - r); ctx.lineTo(X + r, Y); ctx.lineTo(X, Y + r); ctx.lineTo(X - r, Y);
      } else if (kind === "nan") {
        ctx.moveTo(X - r, Y - r); ctx.lineTo(X + r, Y + r); ctx.moveTo(X + r, Y - r);
        ctx.lineTo(X - r, Y + r);
        ctx.strokeStyle = color;
        ctx.lineWidth = 2.5 * pxr();
        ctx.stroke();
        return;
      } else {
        ctx.arc(X, Y, 3.5 * pxr(), 0, 2 * Math.PI);
      }
      ctx.closePath();
      ctx.fillStyle = color;
      ctx.fill();
      ctx.lineWidth = 0.8 * pxr();
      ctx.strokeStyle = "#222";
      ctx.stroke();
    }

    // Scatter series, rules, and the pinned points, over the lines.
    function drawOver(u) {
      const ctx = u.ctx;
      const { left, top, width, height } = u.bbox;
      ctx.save();
      rules.forEach((r) => {
        const at = u.valToPos(r.value, r.axis, true);
        if (!Number.isFinite(at)) return;
        ctx.beginPath();
        ctx.setLineDash([6 * pxr(), 4 * pxr()]);
        ctx.strokeStyle = "#555";
        ctx.lineWidth = pxr();
        if (r.axis === "x" && at >= left && at <= left + width) {
          ctx.moveTo(at, top); ctx.lineTo(at, top + height);
        } else if (r.axis === "y" && at >= top && at <= top + height) {
          ctx.moveTo(left, at); ctx.lineTo(left + width, at);
        }
        ctx.stroke();
      });
      ctx.setLineDash([]);
      if (panel.y.range) leaving(u, ctx);
      P.series.forEach((s, k) => {
        if (!u.series[k + 1].show) return;
        s.x.forEach((x, i) => {
          if (!okX(x)) return;
          const X = u.valToPos(x, "x", true);
          if (!inPlot(u, X)) return;
          const pin = pinOf(s.y[i], ylog);
          if (pin) {
            marker(ctx, pin, X, top + (1 - PINS[pin][0]) * height, s.color);
          } else if (s.flags && s.flags.unresolved && s.flags.unresolved[i]) {
            // a ring round a point whose gap is unresolved (service.plots.draw.mark_unresolved)
            const Y = u.valToPos(s.y[i], "y", true);
            ctx.beginPath();
            ctx.arc(X, Y, 6.5 * pxr(), 0, 2 * Math.PI);
            ctx.strokeStyle = s.color;
            ctx.lineWidth = 1.3 * pxr();
            ctx.stroke();
          } else if (s.style === "points") {
            const Y = u.valToPos(s.y[i], "y", true);
            if (Y >= top - 1 && Y <= top + height + 1) {
              ctx.globalAlpha = 0.75;
              marker(ctx, "dot", X, Y, s.color);
              ctx.globalAlpha = 1;
            }
          }
        });
      });
      ctx.restore();
    }

    // A prediction that leaves the figure's y range (theory_overlay's is the measurements'): an
    // open triangle at the edge where it leaves, as service.plots.draw.clip_to_measured marks it.
    function leaving(u, ctx) {
      const { top, height } = u.bbox;
      const [y0, y1] = panel.y.range.map(num);
      P.series.forEach((s, k) => {
        if (s.style !== "dashed" || !u.series[k + 1].show) return;
        let before = null;
        s.order.forEach((i) => {
          const y = s.y[i];
          const side = !shownY(y) ? null : y < y0 ? "below" : y > y1 ? "above" : null;
          const X = u.valToPos(s.x[i], "x", true);
          if (side && side !== before && okX(s.x[i]) && inPlot(u, X)) {
            const Y = side === "below" ? top + height : top;
            const r = 5 * pxr();
            const d = side === "below" ? 1 : -1;
            ctx.beginPath();
            ctx.moveTo(X, Y + d * r); ctx.lineTo(X + r, Y - d * r * 0.7); ctx.lineTo(X - r, Y - d * r * 0.7);
            ctx.closePath();
            ctx.strokeStyle = s.color;
            ctx.lineWidth = 1.5 * pxr();
            ctx.stroke();
          }
          before = side;
        });
      });
    }

    // --- hover: the nearest drawn or pinned point -------------------------------------------

    const tip = document.createElement("div");
    tip.className = "chart-tip";
    tip.hidden = true;

    function near(u, s, left) {
      // indices of s whose x lies within NEAR px of the cursor (binary search on sorted x)
      if (s.style === "points") return s.order;
      const x = u.posToVal(left, "x");
      let lo = 0;
      let hi = s.order.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (s.x[s.order[mid]] < x) lo = mid + 1;
        else hi = mid;
      }
      const out = [];
      for (let j = lo - 1; j >= 0; j--) {
        if (Math.abs(u.valToPos(s.x[s.order[j]], "x") - left) > NEAR) break;
        out.push(s.order[j]);
      }
      for (let j = lo; j < s.order.length; j++) {
        if (Math.abs(u.valToPos(s.x[s.order[j]], "x") - left) > NEAR) break;
        out.push(s.order[j]);
      }
      return out;
    }

    function hover(u) {
      const { left, top } = u.cursor;
      if (left === undefined || left < 0) {
        tip.hidden = true;
        return;
      }
      const h = u.bbox.height / pxr();
      let best = null;
      P.series.forEach((s, k) => {
        if (!u.series[k + 1].show) return;
        for (const i of near(u, s, left)) {
          if (!okX(s.x[i])) continue;
          const pin = pinOf(s.y[i], ylog);
          const px = u.valToPos(s.x[i], "x");
          const py = pin ? (1 - PINS[pin][0]) * h : u.valToPos(s.y[i], "y");
          const d = Math.hypot(px - left, py - top);
          if (d <= NEAR && (best === null || d < best.d)) best = { d, s, i, px, py };
        }
      });
      if (best === null) {
        tip.hidden = true;
        return;
      }
      const { s, i } = best;
      const xText = P.ticks && Number.isInteger(s.x[i]) ? P.ticks[s.x[i]] : fmt(s.x[i]);
      const lines = [s.label, `x = ${xText} · y = ${fmt(s.y[i])}`];
      if (s.lo && Number.isFinite(s.lo[i])) {
        lines.push(`${panel.band || "band"}: ${fmt(s.lo[i])} … ${fmt(s.hi[i])}`);
      }
      if (s.count) lines.push(`${s.count[i]} value${s.count[i] === 1 ? "" : "s"} pooled`);
      Object.entries(s.flags || {}).forEach(([k, v]) => v[i] && lines.push(k));
      tip.textContent = lines.join("\n");
      tip.hidden = false;
      tip.style.left = `${Math.round(best.px + 12)}px`;
      tip.style.top = `${Math.round(best.py + 8)}px`;
      tip.dataset.series = s.label;
    }

    const opts = {
      width: state.width,
      height: HEIGHT,
      legend: { show: P.series.length <= MAX_LEGEND, live: false },
      cursor: { drag: { x: true, y: false, setScale: true }, points: { show: false } },
      scales: {
        x: {
          time: false, distr: xlog ? 3 : 1, log: 10,
          range: (u, lo, hi) => (lo === null || (lo === xs[0] && hi === xs[xs.length - 1]) ? full : [lo, hi]),
        },
        y: { distr: ylog ? 3 : 1, log: 10, auto: false, range: () => yWin },
      },
      axes: [xAxis, yAxis],
      series: [{ label: "x" }, ...seriesOpts],
      hooks: {
        drawAxes: [drawBands],
        draw: [drawOver],
        setCursor: [hover],
        setScale: [(u, key) => {
          if (key !== "x") return;
          const w = yWindow(u, u.scales.x.min, u.scales.x.max);
          if (w[0] !== yWin[0] || w[1] !== yWin[1]) {
            yWin = w;
            u.setScale("y", { min: w[0], max: w[1] });
          }
        }],
        setSelect: [(u) => {
          if (u.select.width < 4) return; // a drag of a few px is a click
          const left = u.select.left;
          state.zoom = [u.posToVal(left, "x"), u.posToVal(left + u.select.width, "x")];
        }],
        setSeries: [(u, si) => {
          const s = P.series[si - 1];
          if (s) (u.series[si].show ? state.hidden.delete(s.label) : state.hidden.add(s.label));
          yWin = yWindow(u, u.scales.x.min, u.scales.x.max);
          u.setScale("y", { min: yWin[0], max: yWin[1] });
        }],
      },
    };
    const u = new uPlot(opts, data, target);
    u.over.appendChild(tip);
    u.over.addEventListener("dblclick", () => (state.zoom = null)); // zoomed out: follow the data
    return { u, P };
  }

  // --- a chart: its title, and per panel the caption, switches, plot and notes -----------------

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }

  function scaleSwitch(name, axis, values, state, redraw) {
    const label = el("label", "chart-scale", `${name} `);
    const select = el("select");
    select.dataset.axis = name;
    ["linear", "log"].forEach((v) => {
      const o = el("option", null, v);
      o.value = v;
      select.appendChild(o);
    });
    select.value = state[name + "scale"];
    const ok = logAllowed(values, axis);
    select.options[1].disabled = !ok;
    if (!ok) {
      label.classList.add("off");
      label.title = axis.ticks ? "a category axis" : "log needs positive values: this axis has values ≤ 0";
    }
    select.disabled = Boolean(axis.ticks);
    select.addEventListener("change", () => {
      state[name + "scale"] = select.value;
      state.zoom = null;
      redraw();
    });
    label.appendChild(select);
    return label;
  }

  function notes(panel, P, ylog) {
    const out = [];
    if (panel.legend && P.series.length <= MAX_LEGEND) out.push(`lines: ${panel.legend}`);
    if (P.series.length > MAX_LEGEND) out.push(`${P.series.length} lines (no legend; hover names them)`);
    if (panel.band && P.series.some((s) => s.lo)) out.push(`shaded: ${panel.band} over seeds`);
    const counts = {};
    P.series.forEach((s) => s.y.forEach((y) => {
      const pin = pinOf(y, ylog);
      if (pin) counts[pin] = (counts[pin] || 0) + 1;
    }));
    Object.entries(counts).forEach(([k, n]) => {
      const [, glyph, text, where] = PINS[k];
      out.push(`${glyph} ${panel.stat || "value"} ${text}: ${n} point${n === 1 ? "" : "s"} (at the ${where})`);
    });
    const rings = P.series.reduce((n, s) => n + ((s.flags || {}).unresolved || [])
      .filter((f, i) => f && Number.isFinite(s.y[i])).length, 0);
    if (rings) {
      out.push(`○ unresolved (an error bar ≥ 10% or +∞ for a seed): ${rings} point${rings === 1 ? "" : "s"}`);
    }
    (panel.rules || []).forEach((r) => out.push(`dashed grey: ${r.label}`));
    return out.join(" · ");
  }

  function drawPanel(box, chart, panel, state) {
    if (box._uplot) box._uplot.destroy();
    box.replaceChildren();
    if (panel.caption) box.appendChild(el("p", "chart-caption", panel.caption));
    const tools = el("div", "chart-tools");
    if (panel.y.label) tools.appendChild(el("span", "chart-ylabel", `↑ ${panel.y.label}`));
    const redraw = () => drawPanel(box, chart, panel, state);
    const xs = panel.series.flatMap((s) => s.x.map(num));
    const ys = panel.series.flatMap((s) => s.y.map(num));
    tools.appendChild(scaleSwitch("x", panel.x, xs, state, redraw));
    const bars = panel.series.some((s) => s.style === "bars");
    const yAxis = bars ? { ...panel.y, ticks: ["bars"] } : panel.y; // bars stand on 0: linear
    tools.appendChild(scaleSwitch("y", yAxis, ys, state, redraw));
    box.appendChild(tools);
    const target = el("div", "chart-plot");
    box.appendChild(target);
    state.width = Math.max(320, Math.min(box.clientWidth || 880, 1100));
    const { u, P } = plot(target, chart, panel, state);
    if (state.zoom) u.setScale("x", { min: state.zoom[0], max: state.zoom[1] });
    const xlabel = el("p", "chart-xlabel", panel.x.label ? `${panel.x.label} →` : "");
    u.root.insertBefore(xlabel, u.root.querySelector(".u-legend")); // under the axis, over the legend
    const text = notes(panel, P, state.yscale === "log");
    if (text) box.appendChild(el("p", "chart-notes", text));
    box._uplot = u;
    box._state = state;
    return u;
  }

  // Draw `chart` into `figure` (its .chart-body), keeping each panel's scales, hidden series and
  // zoom from the chart drawn there before (a live page re-draws as results arrive).
  function draw(figure, chart) {
    const body = figure.querySelector(".chart-body");
    const before = figure._states || [];
    body.querySelectorAll(".chart-panel").forEach((box) => box._uplot && box._uplot.destroy());
    body.replaceChildren();
    const head = el("p", "chart-title", chart.title);
    body.appendChild(head);
    if (chart.empty) {
      body.appendChild(el("p", "chart-empty", `no data: ${chart.empty}`));
    }
    figure._states = chart.panels.map((panel, k) => {
      const old = before[k];
      const state = {
        xscale: old ? old.xscale : panel.x.scale,
        yscale: old ? old.yscale : panel.y.scale,
        hidden: old ? old.hidden : new Set(),
        zoom: old ? old.zoom : null,
      };
      const box = el("div", "chart-panel");
      body.appendChild(box);
      drawPanel(box, chart, panel, state);
      return state;
    });
    figure.dataset.drawn = String(Date.now());
  }

  function resize() {
    document.querySelectorAll(".chart-panel").forEach((box) => {
      if (!box._uplot) return;
      const width = Math.max(320, Math.min(box.clientWidth, 1100));
      if (width !== box._uplot.width) box._uplot.setSize({ width, height: HEIGHT });
    });
  }
  let timer = null;
  window.addEventListener("resize", () => {
    clearTimeout(timer);
    timer = setTimeout(resize, 150);
  });

  return { draw, fmt, num };
})();
