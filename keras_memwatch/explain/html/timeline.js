// keras_memwatch HTML report: draws the figures with plotly.js, and fills
// each timeline panel from the record packed into #memwatch-record.
// Decimates for drawing only: beyond DRAW_ALL rows in view, each of BUCKETS
// buckets keeps its rows of lowest and highest peak and in-use, and every
// spike; zooming redraws the range in view from the full record. Every
// point drawn is a real row, and its hover shows that row's figures.
(function () {
  "use strict";
  var DRAW_ALL = 5000, BUCKETS = 1000, MIB = 1048576;
  var PHASES = ["train", "test", "predict"];
  var TYPES = {"<f8": Float64Array, "<i4": Int32Array, "|u1": Uint8Array};
  var CONFIG = {responsive: true, displaylogo: false, scrollZoom: true};

  function bytesOf(text) {
    var raw = atob(text), out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }

  function inflate(bytes) {
    var stream = new Blob([bytes]).stream()
      .pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).arrayBuffer();
  }

  function columnsOf(buffer, panel) {
    var out = {};
    Object.keys(panel.columns).forEach(function (name) {
      var spec = panel.columns[name];
      out[name] = new TYPES[spec[0]](buffer, spec[1], panel.rows);
    });
    out.rows = panel.rows;
    out.shapes = panel.shapes;
    return out;
  }

  function firstAtLeast(x, value) {
    var lo = 0, hi = x.length;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (x[mid] < value) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  function lowestHighest(values, i, low, high) {
    var v = values[i];
    if (v !== v) return;
    if (low[0] < 0 || v < values[low[0]]) low[0] = i;
    if (high[0] < 0 || v > values[high[0]]) high[0] = i;
  }

  // The rows to draw between rows lo (inclusive) and hi (exclusive).
  function pick(c, lo, hi) {
    var out = [], i;
    if (hi - lo <= DRAW_ALL) {
      for (i = lo; i < hi; i++) out.push(i);
      return out;
    }
    var size = Math.ceil((hi - lo) / BUCKETS);
    for (var start = lo; start < hi; start += size) {
      var end = Math.min(start + size, hi);
      var pl = [-1], ph = [-1], cl = [-1], ch = [-1], chosen = [];
      for (i = start; i < end; i++) {
        lowestHighest(c.peak, i, pl, ph);
        lowestHighest(c.current, i, cl, ch);
        if (c.spike[i]) chosen.push(i);
      }
      chosen.push(start, pl[0], ph[0], cl[0], ch[0]);
      chosen.filter(function (j) { return j >= 0; })
        .sort(function (a, b) { return a - b; })
        .forEach(function (j) {
          if (out.length === 0 || out[out.length - 1] < j) out.push(j);
        });
    }
    return out;
  }

  function mib(v) { return v === v ? v / MIB : null; }

  function size(v) { return v === v ? (v / MIB).toFixed(1) + " MiB" : "n/a"; }

  function hover(c, i) {
    var batch = c.batch[i] < 0 ? "begin" : c.batch[i];
    var lines = [
      "<b>epoch " + c.epoch[i] + " batch " + batch + "</b> (" +
        PHASES[c.phase[i]] + ", call " + c.call[i] + ")",
      "peak " + size(c.peak[i]), "in use " + size(c.current[i]),
      "baseline " + size(c.baseline[i])];
    if (c.shape[i] >= 0) lines.push("input shape " + c.shapes[c.shape[i]]);
    if (c.spike[i]) lines.push("<b>spike</b>");
    return lines.join("<br>");
  }

  // The band: one closed outline per run of rows with both edges known
  // (along the baseline, back along the memory in use before the step),
  // runs apart by a gap.
  function band(c, rows) {
    var bx = [], by = [], run = [];
    function close() {
      if (run.length) {
        run.forEach(function (i) { bx.push(c.x[i]); by.push(c.baseline[i] / MIB); });
        run.slice().reverse().forEach(function (i) {
          bx.push(c.x[i]); by.push(c.before[i] / MIB);
        });
        bx.push(null); by.push(null);
      }
      run = [];
    }
    rows.forEach(function (i) {
      if (c.baseline[i] === c.baseline[i] && c.before[i] === c.before[i]) run.push(i);
      else close();
    });
    close();
    return [bx, by];
  }

  function traces(c, rows) {
    var x = [], peak = [], current = [], text = [], edges = band(c, rows);
    rows.forEach(function (i) {
      x.push(c.x[i]);
      peak.push(mib(c.peak[i]));
      current.push(mib(c.current[i]));
      text.push(hover(c, i));
    });
    return {x: [edges[0], x, x], y: [edges[1], peak, current], text: [[], text, text]};
  }

  function rowsIn(c, range) {
    if (!range) return pick(c, 0, c.rows);
    var lo = Math.max(firstAtLeast(c.x, Math.ceil(range[0])) - 1, 0);
    var hi = Math.min(firstAtLeast(c.x, Math.floor(range[1]) + 1) + 1, c.rows);
    return pick(c, lo, hi);
  }

  function drawTimeline(div, figure, c) {
    var rows = rowsIn(c, null), filled = traces(c, rows);
    for (var t = 0; t < 3; t++) {
      figure.data[t].x = filled.x[t];
      figure.data[t].y = filled.y[t];
      figure.data[t].text = filled.text[t];
    }
    div.dataset.drawn = rows.length;
    return Plotly.newPlot(div, figure.data, figure.layout, CONFIG).then(function () {
      var pending = null;
      div.on("plotly_relayout", function (event) {
        var range;
        if ("xaxis.range[0]" in event) {
          range = [event["xaxis.range[0]"], event["xaxis.range[1]"]];
        } else if (event["xaxis.range"]) {
          range = event["xaxis.range"];
        } else if (event["xaxis.autorange"]) {
          range = null;
        } else {
          return;
        }
        if (pending) cancelAnimationFrame(pending);
        pending = requestAnimationFrame(function () {
          pending = null;
          var picked = rowsIn(c, range), update = traces(c, picked);
          div.dataset.drawn = picked.length;
          Plotly.restyle(div, update, [0, 1, 2]);
        });
      });
    });
  }

  function fail(message) {
    document.querySelectorAll(".memwatch-timeline").forEach(function (div) {
      div.textContent = message;
      div.classList.add("memwatch-error");
    });
  }

  function main() {
    var figures = JSON.parse(document.getElementById("memwatch-figures").textContent);
    var done = [];
    figures.charts.forEach(function (chart) {
      done.push(Plotly.newPlot(document.getElementById(chart.id), chart.figure.data,
                               chart.figure.layout, CONFIG));
    });
    var header = JSON.parse(document.getElementById("memwatch-header").textContent);
    var block = document.getElementById("memwatch-record").textContent.trim();
    var timelines;
    if (typeof DecompressionStream === "undefined") {
      fail("This browser cannot unpack the record (it needs DecompressionStream: " +
           "Chrome 80, Firefox 113, Safari 16.4 or later).");
      timelines = Promise.resolve();
    } else {
      timelines = inflate(bytesOf(block)).then(function (buffer) {
        return Promise.all(figures.timelines.map(function (panel, n) {
          return drawTimeline(document.getElementById(panel.id), panel.figure,
                              columnsOf(buffer, header.panels[n]));
        }));
      });
    }
    Promise.all(done.concat([timelines])).then(function () {
      document.body.dataset.ready = "1";
    }, function (error) {
      fail("The timeline could not be drawn: " + error);
      document.body.dataset.ready = "error";
      throw error;
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", main);
  } else {
    main();
  }
})();
