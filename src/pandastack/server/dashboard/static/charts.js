// Charts drawn as SVG by this file (no library, nothing fetched): a line chart of samples
// over time and a bar chart of values per day. Each chart states its scale on its <svg>
// (data-x0/x1: the plot's left and right edge, data-y0/y1: its top and bottom, data-t0/t1:
// the time span across it, data-y-max: the value at its top), so a reader (the browser
// tests) can turn every drawn point back into the value it was drawn from.
import {svg} from "./api.js";

const WIDTH = 720, HEIGHT = 200;
const PLOT = {x0: 72, x1: WIDTH - 8, y0: 10, y1: HEIGHT - 28};

function round(n) {
  return Math.round(n * 100) / 100;
}

function scaleY(value, yMax) {
  const clamped = Math.min(Math.max(value, 0), yMax);
  return PLOT.y1 - (clamped / yMax) * (PLOT.y1 - PLOT.y0);
}

function frame(label, yMax, yFormat, extra) {
  return svg("svg", {viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": label,
                     "data-x0": PLOT.x0, "data-x1": PLOT.x1, "data-y0": PLOT.y0,
                     "data-y1": PLOT.y1, "data-y-max": yMax, ...extra},
    svg("line", {x1: PLOT.x0, y1: PLOT.y1, x2: PLOT.x1, y2: PLOT.y1, class: "axis-line"}),
    svg("line", {x1: PLOT.x0, y1: PLOT.y0, x2: PLOT.x1, y2: PLOT.y0, class: "grid-line"}),
    svg("text", {x: PLOT.x0 - 4, y: PLOT.y0 + 4, "text-anchor": "end", class: "axis"},
        yFormat(yMax)),
    svg("text", {x: PLOT.x0 - 4, y: PLOT.y1, "text-anchor": "end", class: "axis"},
        yFormat(0)));
}

// samples: [{t: unix seconds, v: value}], oldest first; the chart spans the `spanSeconds`
// up to the newest sample, and draws what falls in that span.
export function lineChart({label, samples, yMax, yFormat, spanSeconds, name}) {
  const t1 = samples.length ? samples[samples.length - 1].t : 0;
  const t0 = t1 - spanSeconds;
  const shown = samples.filter((s) => s.t >= t0);
  const x = (t) => PLOT.x0 + ((t - t0) / spanSeconds) * (PLOT.x1 - PLOT.x0);
  const points = shown.map((s) => `${round(x(s.t))},${round(scaleY(s.v, yMax))}`).join(" ");
  const last = shown[shown.length - 1];
  const chart = frame(label, yMax, yFormat, {"data-t0": t0, "data-t1": t1,
                                             "data-chart": name});
  chart.append(
    svg("text", {x: PLOT.x0, y: HEIGHT - 8, class: "axis"}, `${spanSeconds / 60} min ago`),
    svg("text", {x: PLOT.x1, y: HEIGHT - 8, "text-anchor": "end", class: "axis"}, "now"),
    svg("polyline", {points, class: "line", "data-series": name}),
    last ? svg("circle", {cx: round(x(last.t)), cy: round(scaleY(last.v, yMax)), r: 3,
                          class: "dot"}, svg("title", {}, yFormat(last.v))) : null);
  return chart;
}

// days: [{day: "YYYY-MM-DD", v: value}] over consecutive days (missing ones are zero bars);
// each bar carries its day and value (data-day, data-value) and its tooltip.
export function barChart({label, days, yFormat, name}) {
  const yMax = Math.max(...days.map((d) => d.v), 0) || 1;
  const step = (PLOT.x1 - PLOT.x0) / Math.max(days.length, 1);
  const chart = frame(label, yMax, yFormat, {"data-chart": name, "data-days": days.length});
  const labelEvery = Math.ceil(days.length / 10);
  days.forEach((d, i) => {
    const top = scaleY(d.v, yMax);
    chart.append(svg("rect", {x: round(PLOT.x0 + i * step + step * 0.1), y: round(top),
                              width: round(step * 0.8), height: round(PLOT.y1 - top),
                              class: "bar", "data-day": d.day, "data-value": d.v},
                         svg("title", {}, `${d.day}: ${yFormat(d.v)}`)));
    if (i % labelEvery === 0) {
      chart.append(svg("text", {x: round(PLOT.x0 + i * step + step / 2), y: HEIGHT - 8,
                                "text-anchor": "middle", class: "axis"}, d.day.slice(5)));
    }
  });
  return chart;
}

// The UTC days from `start` (unix seconds) to today, each with the value `rows` give it.
export function everyDay(rows, start, value) {
  const byDay = new Map(rows.filter((r) => r.day).map((r) => [r.day, value(r)]));
  const days = [];
  const today = new Date().toISOString().slice(0, 10);
  for (let t = start * 1000; ; t += 86400_000) {
    const day = new Date(t).toISOString().slice(0, 10);
    days.push({day, v: byDay.get(day) || 0});
    if (day >= today) break;
  }
  return days;
}
