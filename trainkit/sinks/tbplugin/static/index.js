// trainkit's TensorBoard tab: plain DOM, no framework, nothing fetched beyond this server.
// TensorBoard loads this module in an iframe whose <base> is /data/plugin/trainkit/, so
// './runs' and './report' are this plugin's routes.

const PERFETTO = 'https://ui.perfetto.dev';
const PARTS = [
  ['data_wait', 'data wait', '#d62728'],
  ['h2d', 'host→device', '#ff7f0e'],
  ['forward', 'forward', '#1f77b4'],
  ['backward', 'backward', '#2ca02c'],
  ['optimizer', 'optimizer', '#9467bd'],
  ['other', 'other', '#a0a0a0'],
];
const CSS = `
body { font-family: Roboto, Arial, sans-serif; margin: 16px 24px; color: #212121; }
h2 { font-size: 16px; margin: 22px 0 8px; border-bottom: 1px solid #e0e0e0; padding-bottom: 4px; }
.bar { display: flex; height: 28px; width: 100%; max-width: 900px; border-radius: 3px; overflow: hidden; }
.bar div { height: 100%; }
.legend span { display: inline-block; margin: 6px 16px 0 0; font-size: 13px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 5px; }
table { border-collapse: collapse; font-size: 13px; max-width: 1200px; }
td, th { text-align: left; vertical-align: top; padding: 4px 8px; border-bottom: 1px solid #eee; }
.high { color: #c62828; font-weight: bold; } .medium { color: #ef6c00; } .low { color: #616161; }
.muted { color: #757575; font-size: 13px; } code { font-size: 12px; }
button { margin-left: 8px; }
`;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'style') Object.assign(node.style, v);
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

async function getJson(url) {
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status}`);
  return resp.json();
}

function breakdown(b) {
  if (!b || !b.step) return el('p', {class: 'muted'}, 'no timed steps recorded (tk.patch(optimizer) records them)');
  const bar = el('div', {class: 'bar', id: 'breakdown'});
  const legend = el('div', {class: 'legend'});
  for (const [key, label, color] of PARTS) {
    const ms = b[key] || 0;
    const pct = (100 * ms) / b.step;
    if (pct > 0) bar.append(el('div', {title: `${label}: ${ms.toFixed(2)} ms`, style: {width: `${pct}%`, background: color}}));
    legend.append(el('span', {}, el('i', {style: {background: color}}), `${label} ${ms.toFixed(2)} ms (${pct.toFixed(0)}%)`));
  }
  // the median too: trainkit demo's summary says it, and a few slow steps (an evaluation's) pull up the mean
  const median = b.median_step === undefined ? '' : `, median ${b.median_step.toFixed(2)} ms`;
  return el('div', {}, el('p', {class: 'muted'}, `mean step ${b.step.toFixed(2)} ms${median}`), bar, legend);
}

// The breakdown is a mean over the timed steps less the first (warm-up) and those that compiled
// (seconds of torch.compile): the heading says so, as a count that differs from the run's.
function stepsCounted(rep) {
  const n = rep.steps;
  const left = rep.left_out || {};
  const out = [];
  if (left.first) out.push('the first (warm-up)');
  if (left.compiled) out.push(`${left.compiled} that compiled`);
  if (!out.length) return `Step time breakdown (mean of ${n} step${n === 1 ? '' : 's'})`;
  return `Step time breakdown (mean of ${n} of the ${rep.timed_steps} timed steps: ${out.join(' and ')} left out)`;
}

function findings(list) {
  if (!list.length) return el('p', {class: 'muted'}, 'no findings: nothing in the records or traces points at lost step time');
  const table = el('table', {id: 'findings'}, el('tr', {}, ...['code', 'severity', 'share', 'finding', 'evidence', 'fix'].map((h) => el('th', {}, h))));
  for (const f of list) {
    const share = f.share === null ? '—' : `${(100 * f.share).toFixed(0)}%`;
    table.append(el('tr', {}, el('td', {}, f.code), el('td', {class: f.severity}, f.severity), el('td', {}, share),
                     el('td', {}, f.title), el('td', {}, f.evidence), el('td', {}, el('code', {}, f.fix))));
  }
  return table;
}

function ablation(a) {
  if (!a.rows.length) return el('p', {class: 'muted', id: 'ablation'}, a.message || 'no ablation recorded');
  const cols = [...new Set(a.rows.flatMap((row) => Object.keys(row)))];  // rows may differ
  const table = el('table', {}, el('tr', {}, ...cols.map((c) => el('th', {}, c))));
  for (const row of a.rows) table.append(el('tr', {}, ...cols.map((c) => el('td', {}, row[c] ?? ''))));
  return el('div', {id: 'ablation'}, table, ...(a.message ? [el('p', {class: 'muted'}, a.message)] : []));
}

async function openInPerfetto(url, title) {
  // Perfetto's documented postMessage protocol: PING until it answers PONG, then send the trace.
  const buffer = await (await fetch(url)).arrayBuffer();
  const win = window.open(PERFETTO);
  if (!win) { alert('Allow pop-ups for TensorBoard, or download the trace and open it at ' + PERFETTO); return; }
  const timer = setInterval(() => win.postMessage('PING', PERFETTO), 50);
  const onMessage = (evt) => {
    if (evt.data !== 'PONG') return;
    clearInterval(timer);
    window.removeEventListener('message', onMessage);
    win.postMessage({perfetto: {buffer, title}}, PERFETTO);
  };
  window.addEventListener('message', onMessage);
}

function traceItem(run, name) {
  const url = `./trace?run=${encodeURIComponent(run)}&file=${encodeURIComponent(name)}`;
  return el('li', {}, el('a', {href: url, download: name}, name),
            el('button', {onclick: () => openInPerfetto(url, name)}, 'open in Perfetto'));
}

// Which steps the analyzed traces hold, numbered as trainkit/step_time_ms numbers them (as
// `trainkit analyze` says it): the findings above are of these steps alone.
function profiledSteps(p) {
  if (!p || !p.traces) return '';
  const spans = (p.steps || []).map(([a, b]) => (a === b ? `${a}` : `${a}-${b}`));
  const parts = [];
  if (spans.length) parts.push((spans.length === 1 && p.steps[0][0] === p.steps[0][1] ? 'step ' : 'steps ') + spans.join(', '));
  if (p.unnumbered) parts.push(`${p.unnumbered} without ProfilerStep marks, each taken whole as one step`);
  const count = `${p.traces} trace${p.traces === 1 ? '' : 's'}`;
  return `Analyzed: ${parts.join('; ')} (${count}), numbered as in trainkit/step_time_ms.`;
}

function traces(run, rep) {
  const names = rep.traces, writing = rep.writing || [], earlier = rep.earlier_traces || [];
  const parts = [];
  if (names.length || writing.length) {
    const list = el('ul', {id: 'traces'}, ...names.map((name) => traceItem(run, name)));
    for (const name of writing) {
      list.append(el('li', {class: 'writing'}, name, el('span', {class: 'muted'},
        ' — still being written by torch.profiler; analyzed once complete (this page checks again every 5 s)')));
    }
    parts.push(list);
    const said = profiledSteps(rep.profiled);
    if (said) parts.push(el('p', {id: 'profiled'}, said));
  } else {
    parts.push(el('p', {class: 'muted'}, 'no traces: profile with tk.session(..., profile=tk.ProfileSchedule(wait=10, warmup=2, active=3))'));
  }
  if (earlier.length) {
    parts.push(el('p', {class: 'muted'}, 'From earlier sessions in this folder (not analyzed: written before the session shown began):'),
               el('ul', {id: 'earlier-traces'}, ...earlier.map((name) => traceItem(run, name))));
  }
  if (names.length || earlier.length) {
    parts.push(el('p', {class: 'muted'},
      `"open in Perfetto" opens ${PERFETTO} and hands it the trace from this page; or download it and use Perfetto's "Open trace file". ` +
      'They also load in torch-tb-profiler (pip install ".[profiler-tab]" from the trainkit checkout).'));
  }
  return el('div', {}, ...parts);
}

// The run's event files and traces that were not read (a named pipe, a broken link, a file the
// user may not read): said on the page, not only in the JSON, since the findings lack them.
function skipped(rep) {
  const list = rep.skipped || [];
  if (!list.length) return [];
  return [el('p', {id: 'skipped', class: 'medium'},
    'Left out of the analysis (not read): ' + list.map(([name, what]) => `${name} (${what})`).join('; ') +
    '; trainkit analyze on this logdir says how to fix each.')];
}

// The logdir's folders whose runs cannot be found (no permission to list or to enter them):
// said above the runs, which would otherwise lack theirs without a word.
async function leftOut() {
  let list;
  try {
    list = await getJson('./left_out');
  } catch (err) {
    return [el('p', {class: 'medium', id: 'left-out'}, 'folders left out of this logdir cannot be listed: ' + String(err))];
  }
  if (!list.length) return [];
  return [el('p', {class: 'medium', id: 'left-out'}, 'Not read: ' + list.map((f) => f.said).join('; ') + '.')];
}

let shown = null;  // the run on screen: a re-check for a trace being written is for it only
let recheck = null;

async function showRun(root, run, quiet = false) {
  shown = run;
  clearTimeout(recheck);  // one re-check at a time, whichever run was picked last
  if (!quiet) root.replaceChildren(el('p', {class: 'muted'}, `loading ${run}…`));
  try {
    const rep = await getJson(`./report?run=${encodeURIComponent(run)}`);
    if (shown !== run) return;  // another run was picked meanwhile
    root.replaceChildren(...skipped(rep),
      el('h2', {id: 'breakdown-heading'}, stepsCounted(rep)), breakdown(rep.breakdown),
      el('h2', {}, 'Findings'), findings(rep.findings),
      el('h2', {}, 'Ablation'), ablation(rep.ablation),
      el('h2', {}, 'Traces'), traces(run, rep));
    if ((rep.writing || []).length) {
      recheck = setTimeout(() => { if (shown === run) showRun(root, run, true); }, 5000);
    }
  } catch (err) {
    if (shown === run) root.replaceChildren(el('p', {class: 'high'}, String(err)));
  }
}

export async function render() {
  document.head.append(el('style', {}, CSS));
  const root = el('div', {id: 'report'});
  let runs;
  try {
    runs = await getJson('./runs');
  } catch (err) {  // a server error: said, not a blank tab
    document.body.append(el('p', {class: 'high'}, 'trainkit runs cannot be listed: ' + String(err)));
    return;
  }
  document.body.append(...await leftOut());
  if (!runs.length) {
    document.body.append(el('p', {}, 'No trainkit runs in this logdir: record one with tk.session(logdir=...).'));
    return;
  }
  const select = el('select', {id: 'run', onchange: () => showRun(root, select.value)},
                    ...runs.map((r) => el('option', {value: r}, r)));
  document.body.append(el('div', {}, el('b', {}, 'trainkit run '), select), root);
  await showRun(root, runs[0]);
}
