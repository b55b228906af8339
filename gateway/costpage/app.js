// FleetGate cost page: reads /v1/usage and /v1/usage/budgets with the caller's key and draws inline SVG.
// No external scripts, no innerHTML with data (every label goes through textContent).
"use strict";
(() => {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#3b6fd8", "#d9892b", "#1f9d6b", "#9b51e0", "#e5484d", "#0ea5b7", "#8a6d3b", "#667085"];
  const COLORS = { spend: "#3b6fd8", cache: "#1f9d6b", tier: "#d9892b" };
  const KEY_STORE = "fleetgate.costpage.key";
  const $ = (id) => document.getElementById(id);

  function usd(v) {
    if (v === 0) return "$0";
    const digits = Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 1 ? 2 : Math.abs(v) >= 0.01 ? 4 : 6;
    return "$" + v.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  }
  const int = (n) => Number(n || 0).toLocaleString("en-US");

  function utcDays(n) {
    const end = new Date();
    const days = [];
    for (let i = n - 1; i >= 0; i -= 1) {
      const d = new Date(Date.UTC(end.getUTCFullYear(), end.getUTCMonth(), end.getUTCDate() - i));
      days.push(d.toISOString().slice(0, 10));
    }
    return days;
  }

  async function api(path, key) {
    const res = await fetch(path, { headers: key ? { Authorization: "Bearer " + key } : {} });
    if (!res.ok) {
      let message = res.status + " " + res.statusText;
      try {
        const body = await res.json();
        if (body && body.error && body.error.message) message = body.error.message;
      } catch (_) { /* not JSON */ }
      const err = new Error(message);
      err.status = res.status;
      throw err;
    }
    return res;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function legend(container, series) {
    const box = document.createElement("div");
    box.className = "legend";
    for (const s of series) {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = s.color;
      item.append(swatch, document.createTextNode(s.name));
      box.append(item);
    }
    container.append(box);
  }

  function empty(container, text) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = text;
    container.append(p);
  }

  // Stacked bars: one bar per day, one segment per series.
  function stackedBars(container, days, series) {
    container.replaceChildren();
    // Wide cards get a wider drawing so that text keeps the same size on screen.
    const W = container.closest(".wide") ? 1440 : 720, H = 220, L = 64, R = 8, T = 10, B = 26;
    const totals = days.map((_, i) => series.reduce((a, s) => a + s.values[i], 0));
    const max = Math.max(...totals, 0);
    if (max <= 0) { empty(container, "No spend in this range."); return; }
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "data-series": series.length });
    const plotW = W - L - R, plotH = H - T - B;
    for (let k = 0; k <= 4; k += 1) {
      const y = T + plotH - (plotH * k) / 4;
      root.append(svg("line", { x1: L, x2: W - R, y1: y, y2: y, stroke: "#e4e7ec" }));
      root.append(svg("text", { x: L - 6, y: y + 4, "text-anchor": "end" }, usd((max * k) / 4)));
    }
    const step = plotW / days.length;
    const barW = Math.max(2, step * 0.7);
    const labelEvery = Math.ceil(days.length / 10);
    days.forEach((day, i) => {
      let y = T + plotH;
      const x = L + i * step + (step - barW) / 2;
      for (const s of series) {
        const v = s.values[i];
        if (v <= 0) continue;
        const h = (plotH * v) / max;
        y -= h;
        const rect = svg("rect", { x, y, width: barW, height: Math.max(h, 0.5), fill: s.color, class: "bar",
          "data-series": s.name, "data-day": day, "data-value": v });
        rect.append(svg("title", {}, `${day} · ${s.name}: ${usd(v)}`));
        root.append(rect);
      }
      if (i % labelEvery === 0) {
        root.append(svg("text", { x: x + barW / 2, y: H - 8, "text-anchor": "middle" }, day.slice(5)));
      }
    });
    container.append(root);
    legend(container, series);
  }

  function horizontalBars(container, items) {
    container.replaceChildren();
    if (!items.length || items.every((d) => d.value <= 0)) { empty(container, "No spend in this range."); return; }
    const W = 720, rowH = 24, L = 120, R = 230;
    const H = items.length * rowH + 8;
    const max = Math.max(...items.map((d) => d.value));
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "data-series": 1 });
    items.forEach((d, i) => {
      const y = 4 + i * rowH;
      const w = max > 0 ? ((W - L - R) * d.value) / max : 0;
      root.append(svg("text", { x: L - 8, y: y + 15, "text-anchor": "end" }, d.label));
      const rect = svg("rect", { x: L, y: y + 3, width: Math.max(w, 0.5), height: rowH - 8, fill: d.color,
        class: "bar", "data-series": d.label, "data-value": d.value });
      root.append(rect);
      root.append(svg("text", { x: L + w + 6, y: y + 15 }, `${usd(d.value)} (saved ${usd(d.saved)})`));
    });
    container.append(root);
  }

  function seriesBy(rows, days, attr) {
    const names = [...new Set(rows.map((r) => r[attr]))].sort();
    return names.map((name, i) => ({
      name: name || "(none)",
      color: PALETTE[i % PALETTE.length],
      values: days.map((day) => rows.filter((r) => r.date === day && r[attr] === name)
        .reduce((a, r) => a + r.cost_usd, 0)),
    }));
  }

  function budgets(container, data) {
    container.replaceChildren();
    const shown = data.filter((t) => Object.keys(t.windows || {}).length);
    if (!shown.length) { empty(container, "No budgets or rate limits configured."); return; }
    const labels = { daily_budget: "today", monthly_budget: "this month", rpm: "requests/min", tpm: "tokens/min" };
    for (const t of shown) {
      for (const [name, w] of Object.entries(t.windows)) {
        const money = name.includes("budget");  // also a model's cap: `model_daily_budget:<model>`
        const cap = /^model_(daily|monthly)_budget:(.+)$/.exec(name);
        const used = money ? w.used / 1e6 : w.used;
        const limit = money ? w.limit / 1e6 : w.limit;
        const share = limit > 0 ? used / limit : 1;
        const row = document.createElement("div");
        row.className = "budget";
        row.dataset.tenant = t.tenant;
        row.dataset.window = name;
        const title = document.createElement("div");
        const what = cap ? `${cap[2]} ${cap[1] === "daily" ? "today" : "this month"}` : labels[name] || name;
        title.textContent = `${t.name} · ${what}`;
        const bar = document.createElement("div");
        bar.className = "bar";
        const fill = document.createElement("div");
        fill.className = "fill" + (share >= 1 ? " over" : share >= 0.8 ? " warn" : "");
        fill.style.width = Math.min(100, share * 100).toFixed(1) + "%";
        bar.append(fill);
        const note = document.createElement("small");
        note.textContent = money ? `${usd(used)} of ${usd(limit)} (${(share * 100).toFixed(1)}%)`
          : `${int(Math.ceil(used))} of ${int(limit)}`;
        row.append(title, bar, note);
        container.append(row);
      }
    }
  }

  function modelTable(rows) {
    const groups = new Map();
    for (const r of rows) {
      const k = r.model + "\t" + r.tier;
      const g = groups.get(k) || { model: r.model, base: r.base || "", tier: r.tier, requests: 0, prompt_tokens: 0, cached_tokens: 0,
        completion_tokens: 0, cost_usd: 0, saved_cache_usd: 0, saved_tier_usd: 0 };
      for (const f of ["requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd",
        "saved_cache_usd", "saved_tier_usd"]) g[f] += r[f];
      groups.set(k, g);
    }
    const body = $("table-models").querySelector("tbody");
    body.replaceChildren();
    for (const g of [...groups.values()].sort((a, b) => b.cost_usd - a.cost_usd)) {
      const tr = document.createElement("tr");
      // a LoRA adapter's row names its base model: the deployment whose cost its tokens share
      for (const v of [g.model, g.base || "–", g.tier || "(none)", int(g.requests), int(g.prompt_tokens),
        int(g.cached_tokens), int(g.completion_tokens), usd(g.cost_usd), usd(g.saved_cache_usd), usd(g.saved_tier_usd)]) {
        const td = document.createElement("td");
        td.textContent = v;
        tr.append(td);
      }
      body.append(tr);
    }
  }

  function render(report, budgetData, days) {
    const t = report.totals;
    $("kpi-spend").textContent = usd(t.cost_usd);
    $("kpi-saved-cache").textContent = usd(t.saved_cache_usd);
    $("kpi-saved-tier").textContent = usd(t.saved_tier_usd);
    $("kpi-requests").textContent = int(t.requests);
    $("kpi-tokens").textContent = int(t.prompt_tokens + t.completion_tokens);
    $("kpi-hits").textContent = int(t.cache_hits);
    const byDay = new Map(report.by_day.map((d) => [d.date, d]));
    const pick = (f) => days.map((d) => (byDay.get(d) ? byDay.get(d)[f] : 0));
    stackedBars($("chart-daily"), days, [
      { name: "spend", color: COLORS.spend, values: pick("cost_usd") },
      { name: "saved by caches", color: COLORS.cache, values: pick("saved_cache_usd") },
      { name: "saved by tiering", color: COLORS.tier, values: pick("saved_tier_usd") },
    ]);
    stackedBars($("chart-models"), days, seriesBy(report.data, days, "model"));
    stackedBars($("chart-tenants-daily"), days, seriesBy(report.data, days, "tenant"));
    const top = [...report.by_tenant].sort((a, b) => b.cost_usd - a.cost_usd).slice(0, 10);
    horizontalBars($("chart-top-tenants"), top.map((d, i) => ({ label: d.tenant, value: d.cost_usd,
      saved: d.saved_cache_usd + d.saved_tier_usd, color: PALETTE[i % PALETTE.length] })));
    budgets($("budgets"), budgetData.data);
    modelTable(report.data);
  }

  // `keyless`: the gateway runs with auth off (local mode), no key is needed.
  async function load(event, keyless) {
    if (event) event.preventDefault();
    const key = $("key").value.trim();
    const status = $("status");
    if (!key && !keyless) { status.textContent = "Enter an API key."; return; }
    if (key) sessionStorage.setItem(KEY_STORE, key);
    const days = utcDays(Number($("range").value));
    const query = `start=${days[0]}&end=${days[days.length - 1]}`;
    document.body.dataset.state = "loading";
    status.className = "";
    status.textContent = "Loading…";
    try {
      const [usageRes, budgetRes] = await Promise.all([api("/v1/usage?" + query, key), api("/v1/usage/budgets", key)]);
      const [report, budgetData] = await Promise.all([usageRes.json(), budgetRes.json()]);
      render(report, budgetData, days);
      $("report").hidden = false;
      status.textContent = `${report.scope === "all" ? "All tenants" : "Tenant " + report.scope}, ` +
        `${report.start} to ${report.end} (UTC). Spend is what engines served; savings are what caches and ` +
        "cheaper tiers avoided.";
      document.body.dataset.state = "ready";
    } catch (err) {
      $("report").hidden = true;
      status.className = "error";
      status.textContent = err.message;
      document.body.dataset.state = "error";
    }
  }

  async function downloadCsv(event) {
    event.preventDefault();
    const key = $("key").value.trim();
    const days = utcDays(Number($("range").value));
    const res = await api(`/v1/usage?format=csv&start=${days[0]}&end=${days[days.length - 1]}`, key);
    const url = URL.createObjectURL(await res.blob());
    const a = document.createElement("a");
    a.href = url;
    a.download = "fleetgate-usage.csv";
    a.click();
    URL.revokeObjectURL(url);
  }

  $("auth").addEventListener("submit", load);
  $("csv").addEventListener("click", (e) => { downloadCsv(e).catch((err) => { $("status").textContent = err.message; }); });
  const saved = sessionStorage.getItem(KEY_STORE);
  if (saved) $("key").value = saved;
  fetch("/dashboard/config.json").then((r) => r.json()).then((config) => {
    if (!config.auth_required) {
      $("status").textContent = "Auth is off on this gateway (local mode): showing every tenant.";
      load(null, true);
    } else if (saved) {
      load();
    }
  }).catch((err) => { $("status").textContent = "Cannot read the page's configuration: " + err.message; });
})();
