"""The report's stylesheet, inlined into the page so it renders the same offline.

System font stack, a neutral grey palette with one blue accent, and state colours
(green, amber, red) used only together with a word, never alone. Layout is a centred
column that reflows to one chart per row on narrow screens; charts are SVGs that scale
to their container.
"""

from __future__ import annotations

__all__ = ["CSS"]

CSS = """
:root {
  --text: #1f2328; --muted: #59636e; --faint: #818b98; --border: #d8dee4;
  --line: #eaeef2; --bg: #f6f8fa; --card: #ffffff; --accent: #0969da;
  --mono: ui-monospace, SFMono-Regular, Menlo, Consolas, 'Liberation Mono', monospace;
}
* { box-sizing: border-box; }
html { color-scheme: light; -webkit-text-size-adjust: 100%; }
body {
  margin: 0; background: var(--bg); color: var(--text);
  font: 15px/1.5 system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue',
    'Liberation Sans', Arial, sans-serif;
  -webkit-font-smoothing: antialiased;
}
.wrap { max-width: 1180px; margin: 0 auto; padding: 36px 28px 56px; }
.eyebrow {
  margin: 0 0 4px; color: var(--muted); font-size: 12px; font-weight: 600;
  letter-spacing: .08em; text-transform: uppercase;
}
h1 { margin: 0 0 18px; font-size: 28px; font-weight: 650; letter-spacing: -.01em;
  overflow-wrap: anywhere; }
h2 { margin: 0 0 16px; padding-bottom: 8px; border-bottom: 1px solid var(--border);
  font-size: 20px; font-weight: 650; }
h3 { margin: 0; font-size: 15px; font-weight: 600; }
a { color: var(--accent); }
code { font: 12.5px var(--mono); color: var(--muted); overflow-wrap: anywhere; }
.muted { color: var(--muted); font-weight: 400; }
.bad-text { color: #b3261e; font-weight: 600; }
dl.meta {
  display: grid; grid-template-columns: repeat(auto-fill, minmax(210px, 1fr));
  gap: 14px 28px; margin: 0; padding: 18px 22px;
  background: var(--card); border: 1px solid var(--border); border-radius: 10px;
}
dl.meta dt { color: var(--muted); font-size: 12px; font-weight: 600; letter-spacing: .04em;
  text-transform: uppercase; }
dl.meta dd { margin: 2px 0 0; font-size: 14px; overflow-wrap: anywhere; }
nav.toc { margin: 18px 0 0; font-size: 14px; }
nav.toc a { margin-right: 18px; font-weight: 500; text-decoration: none; }
nav.toc a:hover { text-decoration: underline; }
.notices ul { display: grid; gap: 8px; margin: 20px 0 0; padding: 0; list-style: none; }
.notices li { padding: 10px 14px; border: 1px solid; border-radius: 8px; font-size: 14px; }
.notices li.info { background: #ddf4ff; border-color: #b6e3ff; color: #0a3069; }
.notices li.warn { background: #fff8c5; border-color: #eed888; color: #4d2d00; }
.notices li.bad { background: #ffebe9; border-color: #ffcecb; color: #82071e; }
.cards {
  display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr));
  gap: 16px; margin: 24px 0 0;
}
.card { padding: 16px 18px; background: var(--card); border: 1px solid var(--border);
  border-radius: 10px; }
.card .label { color: var(--muted); font-size: 13px; font-weight: 600; }
.card .value { margin-top: 2px; font-size: 28px; font-weight: 650;
  font-variant-numeric: tabular-nums; letter-spacing: -.01em; }
.card .unit { margin-left: 5px; color: var(--muted); font-size: 15px; font-weight: 500; }
.card .note { margin-top: 2px; color: var(--muted); font-size: 12.5px; line-height: 1.4; }
section.block { margin-top: 44px; }
figure.chart {
  margin: 0 0 16px; padding: 16px 18px 10px; background: var(--card);
  border: 1px solid var(--border); border-radius: 10px; min-width: 0;
}
figure.chart p, p.caption { margin: 2px 0 0; color: var(--muted); font-size: 13px; }
svg.chart { display: block; width: 100%; min-width: 520px; height: auto; margin-top: 10px; }
.scroll { overflow-x: auto; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(440px, 1fr));
  gap: 0 16px; }
.table-wrap { overflow-x: auto; background: var(--card); border: 1px solid var(--border);
  border-radius: 10px; margin: 0 0 16px; }
table { width: 100%; border-collapse: collapse; font-size: 13.5px;
  font-variant-numeric: tabular-nums; }
th { padding: 9px 12px; border-bottom: 1px solid var(--border); background: #fbfcfd;
  color: var(--muted); font-size: 12px; font-weight: 600; letter-spacing: .03em;
  text-align: left; text-transform: uppercase; vertical-align: bottom; }
td { padding: 9px 12px; border-bottom: 1px solid var(--line); vertical-align: top; }
tbody tr:last-child td { border-bottom: 0; }
tbody tr:hover { background: #f6f8fa; }
.num { text-align: right; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin-right: 6px; }
th:first-child { white-space: nowrap; }
.nowrap { white-space: nowrap; }
dd .sub { display: block; color: var(--muted); font-size: 12.5px; }
td .sub { display: block; color: var(--faint); font-size: 12px; }
.pill, .badge { display: inline-block; padding: 0 8px; border-radius: 999px; font-size: 12px;
  font-weight: 600; line-height: 20px; white-space: nowrap; margin: 1px 2px 1px 0; }
.badge { padding: 1px 10px; font-size: 13px; }
.ok { background: #dafbe1; color: #116329; }
.info { background: #ddf4ff; color: #0550ae; }
.warn { background: #fff8c5; color: #7d4e00; }
.bad { background: #ffebe9; color: #a40e26; }
.pill.muted, .badge.muted { background: #eff2f5; color: var(--muted); }
.dot { display: inline-block; width: 10px; height: 10px; margin-right: 7px;
  border-radius: 50%; vertical-align: -1px; }
.empty { margin: 0 0 16px; padding: 16px 18px; background: var(--card);
  border: 1px dashed var(--border); border-radius: 10px; color: var(--muted); }
h3 + .caption { margin-bottom: 10px; }
.node { margin-bottom: 8px; }
.node h3 { display: flex; align-items: center; gap: 8px; }
details > summary { cursor: pointer; margin-bottom: 8px; color: var(--accent); }
footer { margin-top: 48px; color: var(--faint); font-size: 12.5px; }
@media (max-width: 640px) {
  .wrap { padding: 22px 14px 40px; }
  h1 { font-size: 22px; }
  .grid { grid-template-columns: 1fr; }
  .cards, dl.meta { grid-template-columns: 1fr 1fr; gap: 12px; }
  dl.meta { padding: 14px 16px; }
  .card .value { font-size: 24px; }
}
@media print {
  body { background: #fff; }
  figure.chart, .card, dl.meta, .table-wrap { break-inside: avoid; }
}
"""
