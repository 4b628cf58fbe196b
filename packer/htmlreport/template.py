"""The page shell: one HTML document with inline CSS, no scripts, no external resources.

A Content-Security-Policy meta tag forbids every fetch except ``data:`` images, so the
report cannot reach the network even if a string slipped through unescaped.
"""

from __future__ import annotations

from packer.htmlreport.markup import esc

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"

CSS = """
:root{--ink:#1f2933;--muted:#5b6572;--line:#e3e7ec;--soft:#f5f7f9;--accent:#2f5d8a;--warn:#b03a2e;--ok:#2e7d4f}
*{box-sizing:border-box}
html{background:#fff}
body{margin:0;color:var(--ink);font:14px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,"Helvetica Neue",
 Arial,"Noto Sans","DejaVu Sans",sans-serif}
.wrap{max-width:1140px;margin:0 auto;padding:0 28px}
header.top{background:#22303c;color:#e8edf2;padding:22px 0 0}
header.top .eyebrow{font-size:12px;letter-spacing:.08em;text-transform:uppercase;color:#9fb0c0}
header.top h1{margin:2px 0 4px;font-size:26px;font-weight:600;color:#fff}
header.top h1 .version{font:500 16px/1 ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;
 color:#b8c6d3;margin-left:10px}
header.top .sub{color:#9fb0c0;font-size:13px;margin-bottom:14px}
nav.toc{display:flex;gap:2px;flex-wrap:wrap}
nav.toc a{color:#d5dee7;text-decoration:none;padding:8px 12px;border-radius:4px 4px 0 0;font-size:13px}
nav.toc a:hover{background:#2f3f4d;color:#fff}
main{padding-bottom:40px}
section.block{padding:8px 0 22px;border-bottom:1px solid var(--line)}
h2{font-size:20px;font-weight:600;margin:26px 0 10px;padding-top:4px}
h3{font-size:15px;font-weight:600;margin:20px 0 8px}
h4{font-size:13px;font-weight:600;margin:14px 0 6px}
p{margin:6px 0}
.lead{color:var(--muted);max-width:860px;margin-bottom:12px}
.muted{color:var(--muted);font-weight:400}
.mono,code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.5px}
code{background:var(--soft);padding:1px 4px;border-radius:3px}
dl.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:0;margin:8px 0 4px;
 border:1px solid var(--line);border-radius:6px;overflow:hidden}
dl.facts>div{padding:8px 12px;border-right:1px solid var(--line);border-bottom:1px solid var(--line);
 margin:-1px -1px 0 0}
dl.facts dt{font-size:11px;text-transform:uppercase;letter-spacing:.06em;color:var(--muted)}
dl.facts dd{margin:2px 0 0}
dl.facts dd.mono{overflow-wrap:anywhere}
.cols{display:flex;gap:36px;flex-wrap:wrap;align-items:flex-start}
.cols>div{flex:1 1 420px;min-width:0}
table.data{border-collapse:collapse;margin:6px 0;font-size:13px;min-width:360px}
table.data th,table.data td{padding:5px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
table.data thead th{font-size:11px;text-transform:uppercase;letter-spacing:.05em;color:var(--muted);
 border-bottom:1px solid #cfd6de;font-weight:600}
table.data tfoot th,table.data tfoot td{font-weight:600;border-top:1px solid #cfd6de;border-bottom:0}
table.data tbody tr:nth-child(even){background:#fbfcfd}
table.data th[scope=row]{font-weight:500}
table.compact th,table.compact td{padding:3px 10px}
.num{text-align:right!important;font-variant-numeric:tabular-nums}
table.bad{width:100%}
table.bad td.path{white-space:nowrap}
table.bad td.msg{color:var(--muted);font-size:12.5px}
.tag{display:inline-block;padding:0 7px;border-radius:10px;background:#f6e3e1;color:#8a2c22;font-size:12px}
i.dot{display:inline-block;width:9px;height:9px;border-radius:50%;margin-right:7px;vertical-align:0}
details{margin:10px 0}
details>summary{cursor:pointer;color:var(--accent);font-weight:500}
details.split>summary{font-size:15px;font-weight:600;color:var(--ink);margin:14px 0 2px}
pre.json{background:var(--soft);border:1px solid var(--line);border-radius:6px;padding:10px 12px;max-height:420px;
 overflow:auto;margin:8px 0}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:6px 0;font-size:12px;color:var(--muted)}
.legend .key i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px;vertical-align:-1px}
svg.chart{display:block;max-width:100%;height:auto;margin:4px 0}
.sheet{margin:6px 0 14px}
.grid{display:flex;flex-wrap:wrap;gap:8px;margin-top:6px}
figure.cell{margin:0;padding:4px;border:1px solid var(--line);border-radius:4px;background:var(--soft)}
figure.cell .panes{display:flex;gap:2px}
figure.cell img{display:block;background:#000}
figure.cell.damaged{border:2px solid var(--warn)}figure.cell.damaged .flag{color:var(--warn);font-weight:600}
figure.cell figcaption{width:0;min-width:100%;font-size:10.5px;color:var(--muted);line-height:1.3;margin-top:2px;
 overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.cards{display:flex;flex-wrap:wrap;gap:14px}
.card{border:1px solid var(--line);border-radius:6px;padding:10px 12px;width:352px}
.card.flagged{border-color:#d9a39c;border-left:3px solid var(--warn)}
.card-title{font-weight:600;font-size:13px}
ul.sat{list-style:none;padding:0;margin:4px 0 0;font-size:12px;color:var(--muted)}
ul.sat li.flag{color:var(--warn);font-weight:600}
p.sensitive{border-left:4px solid var(--warn);background:#fdf3f2;padding:8px 12px;border-radius:0 4px 4px 0}
p.warn{color:var(--warn)}
p.alert,div.alert{border:1px solid #e3b4ae;background:#fdf3f2;color:var(--warn);padding:8px 12px;border-radius:4px}
div.alert ul{margin:6px 0 0;padding-left:20px}div.alert li{margin:2px 0}
.pass{color:var(--ok)}.fail{color:var(--warn);font-weight:600}.flagged{color:#a0620a;font-weight:600}
.noimg{width:64px;height:64px;background:var(--soft);border:1px dashed var(--line);font-size:10px;color:var(--muted);
 display:flex;align-items:center;justify-content:center;text-align:center}
p.ok{color:var(--ok)}
.pairs{display:flex;flex-wrap:wrap;gap:10px}
.pair{display:flex;gap:6px;align-items:flex-start;border:1px solid var(--line);border-radius:6px;padding:6px}
.pair.cross{border-color:#d9a39c;box-shadow:inset 3px 0 0 var(--warn)}
.pair figure{margin:0;font-size:10.5px;line-height:1.35;width:124px;color:var(--muted)}
.pair figure code{font-size:10.5px;background:none;padding:0;color:var(--ink);overflow-wrap:anywhere}
.pair figure figcaption{overflow-wrap:anywhere;margin-top:3px}
.pair img{display:block;background:#000;width:96px;height:auto}
.pair .dist{font-size:11px;color:var(--muted);align-self:center;width:110px}
footer{color:var(--muted);font-size:12px;padding:16px 0 30px}
@media print{header.top{background:#fff;color:var(--ink)}nav.toc{display:none}details{display:block}}
"""


def render_page(*, title: str, heading: str, version: str, subtitle: str, nav: list[tuple[str, str]],
                body: str, footer: str) -> str:
    """The whole document around ready-made section HTML (``nav``: (anchor id, text) pairs)."""
    links = "".join(f'<a href="#{esc(ident)}">{esc(text)}</a>' for ident, text in nav)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>"
        f'<header class="top"><div class="wrap"><div class="eyebrow">packer dataset report</div>'
        f'<h1>{esc(heading)}<span class="version">{esc(version)}</span></h1>'
        f'<div class="sub">{subtitle}</div><nav class="toc">{links}</nav></div></header>\n'
        f'<main class="wrap">{body}</main>\n'
        f'<footer class="wrap">{footer}</footer>\n</body></html>\n'
    )
