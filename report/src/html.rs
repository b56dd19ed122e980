//! The report page: one self-contained HTML document (inline CSS and SVG,
//! no script, nothing fetched) from parsed history lines. Every plotted
//! point carries its exact values as `data-*` attributes and a `<title>`.
//! No I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use clockmesh_offsets::history::{DeviceHistoryEntry, HistoryEntry};
use clockmesh_trace::MergeSummary;
use clockmesh_trace::collectives::Analysis;
use clockmesh_trace::collectives::critical::CriticalPaths;

use super::lines::{Edge, History};
use super::svg::{Chart, Scale, colour, escape, si};
use super::truth::Truth;

/// What the page is made of.
pub struct Inputs<'a> {
    pub history: &'a History,
    /// Names of the history files, for the header.
    pub files: &'a [String],
    pub truth: Option<(&'a str, &'a Truth)>,
    /// A `trace merge --summary` file: (its name, its content).
    pub merge: Option<(&'a str, &'a MergeSummary)>,
    /// A `trace collectives --json` file: (its name, its content).
    pub collectives: Option<(&'a str, &'a Analysis)>,
    /// A `trace critical-path --json` file: (its name, its content).
    pub critical: Option<(&'a str, &'a CriticalPaths)>,
}

/// Shared by the sections: nodes in name order (their colours) and the
/// time origin of every chart.
struct Ctx<'a> {
    inp: &'a Inputs<'a>,
    nodes: Vec<&'a str>,
    t0_ns: i64,
    by_host: BTreeMap<&'a str, Vec<&'a HistoryEntry>>,
}

impl<'a> Ctx<'a> {
    fn new(inp: &'a Inputs<'a>) -> Self {
        let h = inp.history;
        let mut nodes: BTreeSet<&str> = h.nodes.iter().map(|n| n.host.as_str()).collect();
        for e in &h.edges {
            nodes.extend([e.from.as_str(), e.to.as_str()]);
        }
        nodes.extend(h.devices.iter().map(|d| d.host.as_str()));
        let edge_times = h
            .edges
            .iter()
            .filter_map(|e| e.fit.as_ref())
            .map(|f| f.anchor_ns);
        let t0_ns = h
            .nodes
            .iter()
            .map(|n| n.anchor_ns)
            .chain(edge_times)
            .min()
            .unwrap_or(0);
        let mut by_host: BTreeMap<&str, Vec<&HistoryEntry>> = BTreeMap::new();
        for n in &h.nodes {
            by_host.entry(n.host.as_str()).or_default().push(n);
        }
        for v in by_host.values_mut() {
            v.sort_by_key(|n| n.anchor_ns);
        }
        Ctx {
            inp,
            nodes: nodes.into_iter().collect(),
            t0_ns,
            by_host,
        }
    }

    fn colour_of(&self, node: &str) -> &'static str {
        colour(self.nodes.binary_search(&node).unwrap_or(0))
    }

    /// Seconds since the first anchor.
    fn x(&self, t_ns: i64) -> f64 {
        (i128::from(t_ns) - i128::from(self.t0_ns)) as f64 / 1e9
    }

    fn x_domain(&self) -> (f64, f64) {
        let h = self.inp.history;
        let edge_times = h
            .edges
            .iter()
            .filter_map(|e| e.fit.as_ref())
            .map(|f| f.anchor_ns);
        Scale::domain_of(
            h.nodes
                .iter()
                .map(|n| n.anchor_ns)
                .chain(edge_times)
                .map(|t| self.x(t)),
        )
    }
}

/// The whole page.
pub fn render(inp: &Inputs) -> String {
    let ctx = Ctx::new(inp);
    let mut page = head();
    page.push_str(&summary(&ctx));
    page.push_str(&legend(&ctx));
    page.push_str(&offset_section(&ctx));
    page.push_str(&drift_section(&ctx));
    page.push_str(&truth_section(&ctx));
    page.push_str(&edge_section(&ctx));
    page.push_str(&graph_section(&ctx));
    page.push_str(&device_section(&ctx));
    page.push_str(&handover_section(&ctx));
    if let Some((name, merge)) = inp.merge {
        page.push_str(&merge_section(name, merge));
    }
    if let Some((name, analysis)) = inp.collectives {
        page.push_str(&super::collectives::section(name, analysis));
    }
    if let Some((name, paths)) = inp.critical {
        page.push_str(&super::critical::section(name, paths));
    }
    page.push_str("</body>\n</html>\n");
    page
}

fn head() -> String {
    let css = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1000px}\
        h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ccc}h3{font-size:15px;margin-top:20px}\
        table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}\
        th{background:#f3f3f3}td.name{text-align:left}.tick{font-size:11px;fill:#555}.axis{font-size:12px}\
        .legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}\
        .note{color:#555;font-size:13px}svg text{font-family:sans-serif}";
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>clockmesh report</title>\n<style>{css}</style>\n</head>\n<body>\n<h1>clockmesh report</h1>\n"
    )
}

fn summary(ctx: &Ctx) -> String {
    let h = ctx.inp.history;
    let files: Vec<String> = ctx.inp.files.iter().map(|f| escape(f)).collect();
    let windows = Scale::domain_of(h.nodes.iter().map(|n| n.window as f64));
    let mut s = format!(
        "<p class=\"summary\">History: {}. <span data-count=\"node\">{}</span> node lines, \
         <span data-count=\"edge\">{}</span> edge lines, <span data-count=\"device\">{}</span> device lines, \
         <span data-count=\"handover\">{}</span> hand-over lines, {} other lines; {} nodes",
        files.join(", "),
        h.nodes.len(),
        h.edges.len(),
        h.devices.len(),
        h.handovers.len(),
        h.other,
        ctx.nodes.len()
    );
    if !h.nodes.is_empty() {
        let _ = write!(s, "; windows {} to {}", windows.0, windows.1);
    }
    let _ = writeln!(
        s,
        ". Time axes: seconds since {} ns (each node's own CLOCK_REALTIME).</p>",
        ctx.t0_ns
    );
    s.push_str(
        "<p class=\"note\">Offsets are global − local: what to add to a node's clock to read the \
         global timeline (positive: the node's clock is behind the reference).</p>\n",
    );
    s
}

fn legend(ctx: &Ctx) -> String {
    let mut s = String::from("<p class=\"legend\">");
    for n in &ctx.nodes {
        let _ = write!(
            s,
            "<span><i class=\"sw\" style=\"background:{}\"></i>{}</span>",
            ctx.colour_of(n),
            escape(n)
        );
    }
    s.push_str("</p>\n");
    s
}

fn node_attrs(n: &HistoryEntry) -> String {
    format!(
        r#"data-node="{}" data-window="{}" data-t-ns="{}""#,
        escape(&n.host),
        n.window,
        n.anchor_ns
    )
}

fn offset_section(ctx: &Ctx) -> String {
    let mut s = String::from("<h2>Offset ± bound per node</h2>\n");
    if ctx.by_host.is_empty() {
        s.push_str("<p class=\"note\">No node lines.</p>\n");
        return s;
    }
    s.push_str(
        "<p class=\"note\">Bands: ± bound. Next to offsets of whole ms they may be thinner than \
         the line; the error chart shows them to scale.</p>\n",
    );
    let all = || ctx.by_host.values().flatten();
    let y = Scale::domain_of(all().flat_map(|n| {
        let (o, b) = (n.offset_ns as f64, n.bound_ns as f64);
        [o - b, o + b]
    }));
    let mut c = Chart::new(
        (ctx.x_domain(), "s", "time (s)"),
        (y, "ns", "offset, global − local"),
    );
    for (host, lines) in &ctx.by_host {
        let col = ctx.colour_of(host);
        let pts: Vec<_> = lines
            .iter()
            .map(|n| (ctx.x(n.anchor_ns), n.offset_ns as f64))
            .collect();
        let band: Vec<_> = lines
            .iter()
            .zip(&pts)
            .map(|(n, &(x, o))| (x, o - n.bound_ns as f64, o + n.bound_ns as f64))
            .collect();
        c.band(&band, col);
        c.line(&pts, col);
        for (n, &p) in lines.iter().zip(&pts) {
            let kind = n.anchor_kind.map_or("", |k| k.as_str());
            let attrs = format!(
                r#"class="pt offset" {} data-offset-ns="{}" data-bound-ns="{}" data-anchor-kind="{kind}""#,
                node_attrs(n),
                n.offset_ns,
                n.bound_ns
            );
            let title = format!(
                "{} window {}: offset {} ns ± {} ns",
                n.host, n.window, n.offset_ns, n.bound_ns
            );
            c.point(p, col, &attrs, &title);
        }
    }
    s.push_str(&c.finish("offsets"));
    s
}

fn drift_section(ctx: &Ctx) -> String {
    let mut s = String::from("<h2>Drift per node</h2>\n");
    if ctx.by_host.is_empty() {
        s.push_str("<p class=\"note\">No node lines.</p>\n");
        return s;
    }
    let y = Scale::domain_of(ctx.by_host.values().flatten().map(|n| n.drift_ppb));
    let mut c = Chart::new(
        (ctx.x_domain(), "s", "time (s)"),
        (y, "ppb", "drift, d(global − local)/d(local)"),
    );
    for (host, lines) in &ctx.by_host {
        let col = ctx.colour_of(host);
        let pts: Vec<_> = lines
            .iter()
            .map(|n| (ctx.x(n.anchor_ns), n.drift_ppb))
            .collect();
        c.line(&pts, col);
        for (n, &p) in lines.iter().zip(&pts) {
            let attrs = format!(
                r#"class="pt drift" {} data-drift-ppb="{}""#,
                node_attrs(n),
                n.drift_ppb
            );
            let title = format!("{} window {}: drift {} ppb", n.host, n.window, n.drift_ppb);
            c.point(p, col, &attrs, &title);
        }
    }
    s.push_str(&c.finish("drift"));
    s
}

/// One node line against the truth.
struct Checked<'a> {
    line: &'a HistoryEntry,
    true_ns: f64,
    error_ns: f64,
}

fn checked<'a>(ctx: &Ctx<'a>, truth: &Truth) -> Vec<Checked<'a>> {
    let hs = &ctx.inp.history.handovers;
    ctx.by_host
        .values()
        .flatten()
        .filter_map(|&line| {
            let true_ns = truth.offset_ns(line, hs)?;
            let error_ns = line.offset_ns as f64 - true_ns;
            Some(Checked {
                line,
                true_ns,
                error_ns,
            })
        })
        .collect()
}

fn truth_section(ctx: &Ctx) -> String {
    let mut s = String::from("<h2>Error against the truth (estimated − true)</h2>\n");
    let Some((file, truth)) = ctx.inp.truth else {
        s.push_str("<p class=\"note\">No truth given (<code>--truth FILE</code>).</p>\n");
        return s;
    };
    let rows = checked(ctx, truth);
    let _ = writeln!(
        s,
        "<p class=\"note\">Truth: {}; {} of {} node lines have a known node and reference.</p>",
        escape(file),
        rows.len(),
        ctx.inp.history.nodes.len()
    );
    if rows.is_empty() {
        return s;
    }
    s.push_str(&error_chart(ctx, &rows));
    s.push_str(&error_table(&rows));
    s
}

fn error_chart(ctx: &Ctx, rows: &[Checked]) -> String {
    let y = Scale::domain_of(rows.iter().flat_map(|r| {
        let b = r.line.bound_ns as f64;
        [r.error_ns - b, r.error_ns + b]
    }));
    let mut c = Chart::new(
        (ctx.x_domain(), "s", "time (s)"),
        (y, "ns", "error, ns (band: ± bound)"),
    );
    c.rule(0.0);
    for host in ctx.by_host.keys() {
        let col = ctx.colour_of(host);
        let mine: Vec<&Checked> = rows.iter().filter(|r| r.line.host == *host).collect();
        let pts: Vec<_> = mine
            .iter()
            .map(|r| (ctx.x(r.line.anchor_ns), r.error_ns))
            .collect();
        let band: Vec<_> = mine
            .iter()
            .zip(&pts)
            .map(|(r, &(x, _))| (x, -(r.line.bound_ns as f64), r.line.bound_ns as f64))
            .collect();
        c.band(&band, col);
        c.line(&pts, col);
        for (r, &p) in mine.iter().zip(&pts) {
            let attrs = format!(
                r#"class="pt error" {} data-error-ns="{}" data-true-ns="{}" data-offset-ns="{}" data-bound-ns="{}""#,
                node_attrs(r.line),
                r.error_ns,
                r.true_ns,
                r.line.offset_ns,
                r.line.bound_ns
            );
            let title = format!(
                "{} window {}: error {:.1} ns (bound {} ns)",
                r.line.host, r.line.window, r.error_ns, r.line.bound_ns
            );
            c.point(p, col, &attrs, &title);
        }
    }
    c.finish("errors")
}

fn error_table(rows: &[Checked]) -> String {
    let mut by_node: BTreeMap<&str, Vec<&Checked>> = BTreeMap::new();
    for r in rows {
        by_node.entry(r.line.host.as_str()).or_default().push(r);
    }
    let mut s = String::from(
        "<table class=\"errors\"><tr><th>node</th><th>lines</th><th>|error| p50</th>\
         <th>|error| max</th><th>within bound</th></tr>\n",
    );
    for (node, rs) in by_node {
        let mut abs: Vec<f64> = rs.iter().map(|r| r.error_ns.abs()).collect();
        abs.sort_by(f64::total_cmp);
        let covered = rs
            .iter()
            .filter(|r| r.error_ns.abs() <= r.line.bound_ns as f64)
            .count();
        let _ = writeln!(
            s,
            "<tr data-node=\"{}\"><td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1} %</td></tr>",
            escape(node),
            escape(node),
            rs.len(),
            si(abs[(abs.len() - 1) / 2], "ns"),
            si(abs[abs.len() - 1], "ns"),
            covered as f64 * 100.0 / rs.len() as f64
        );
    }
    s.push_str("</table>\n");
    s
}

/// Edge lines by (from, to).
fn edges_by_pair(h: &History) -> BTreeMap<(&str, &str), Vec<&Edge>> {
    let mut m: BTreeMap<(&str, &str), Vec<&Edge>> = BTreeMap::new();
    for e in &h.edges {
        m.entry((e.from.as_str(), e.to.as_str()))
            .or_default()
            .push(e);
    }
    for v in m.values_mut() {
        v.sort_by_key(|e| e.window);
    }
    m
}

fn edge_section(ctx: &Ctx) -> String {
    let mut s = String::from("<h2>Edges: min RTT and pure ratio</h2>\n");
    let pairs = edges_by_pair(ctx.inp.history);
    if pairs.is_empty() {
        s.push_str("<p class=\"note\">No edge lines.</p>\n");
        return s;
    }
    s.push_str(
        "<p class=\"note\">Each out-edge's fit per window, coloured by its <i>from</i> node \
         (time on that node's clock). Pure ratio: pure first packets over complete probes, both directions.</p>\n",
    );
    s.push_str(&edge_chart(ctx, &pairs, EdgeValue::MinRtt));
    s.push_str(&edge_chart(ctx, &pairs, EdgeValue::PureRatio));
    s.push_str(&edge_table(&pairs));
    s
}

#[derive(Clone, Copy)]
enum EdgeValue {
    MinRtt,
    PureRatio,
}

impl EdgeValue {
    fn of(self, e: &Edge) -> Option<f64> {
        match self {
            Self::MinRtt => e.fit.as_ref().map(|f| f.min_rtt_ns),
            Self::PureRatio => e.pure_ratio(),
        }
    }
}

fn edge_chart(ctx: &Ctx, pairs: &BTreeMap<(&str, &str), Vec<&Edge>>, v: EdgeValue) -> String {
    let timed = |e: &&Edge| Some((ctx.x(e.fit.as_ref()?.anchor_ns), v.of(e)?));
    let y = Scale::domain_of(pairs.values().flatten().filter_map(timed).map(|p| p.1));
    let (y, unit, label, class) = match v {
        EdgeValue::MinRtt => (y, "ns", "min RTT", "rtt"),
        EdgeValue::PureRatio => ((0.0, 1.0), "", "pure ratio", "pure"),
    };
    let mut c = Chart::new((ctx.x_domain(), "s", "time (s)"), (y, unit, label));
    for ((from, _), es) in pairs {
        let col = ctx.colour_of(from);
        let pts: Vec<_> = es.iter().filter_map(timed).collect();
        c.line(&pts, col);
        for e in es {
            let Some(p) = timed(e) else { continue };
            c.point(p, col, &edge_attrs(e, class), &edge_title(e));
        }
    }
    c.finish(class)
}

fn edge_attrs(e: &Edge, class: &str) -> String {
    let fit = e.fit.as_ref();
    format!(
        r#"class="pt {class}" data-from="{}" data-to="{}" data-window="{}" data-t-ns="{}" data-min-rtt-ns="{}" data-pure-ratio="{}""#,
        escape(&e.from),
        escape(&e.to),
        e.window,
        fit.map_or(String::new(), |f| f.anchor_ns.to_string()),
        fit.map_or(String::new(), |f| f.min_rtt_ns.to_string()),
        e.pure_ratio().map_or(String::new(), |r| r.to_string())
    )
}

fn edge_title(e: &Edge) -> String {
    let rtt = e
        .fit
        .as_ref()
        .map_or("no fit".into(), |f| format!("min RTT {} ns", f.min_rtt_ns));
    let ratio = e.pure_ratio().map_or("-".into(), |r| format!("{r:.3}"));
    format!(
        "{} → {} window {}: {rtt}, pure ratio {ratio}",
        e.from, e.to, e.window
    )
}

fn edge_table(pairs: &BTreeMap<(&str, &str), Vec<&Edge>>) -> String {
    let mut s = String::from(
        "<table class=\"edges\"><tr><th>from</th><th>to</th><th>windows</th><th>fits</th>\
         <th>min RTT (last)</th><th>min RTT (lowest)</th><th>pure ratio (last)</th>\
         <th>pure ratio (mean)</th><th>stamps</th><th>last error (window)</th></tr>\n",
    );
    for ((from, to), es) in pairs {
        let fits: Vec<_> = es.iter().filter_map(|e| e.fit.as_ref()).collect();
        let rtt = |v: Option<f64>| v.map_or("-".into(), |r| si(r, "ns"));
        let ratios: Vec<f64> = es.iter().filter_map(|e| e.pure_ratio()).collect();
        let last = es.last().copied();
        let _ = writeln!(
            s,
            "<tr data-from=\"{}\" data-to=\"{}\"><td class=\"name\">{}</td><td class=\"name\">{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"name\">{}</td></tr>",
            escape(from),
            escape(to),
            escape(from),
            escape(to),
            es.len(),
            fits.len(),
            rtt(fits.last().map(|f| f.min_rtt_ns)),
            rtt(fits.iter().map(|f| f.min_rtt_ns).min_by(f64::total_cmp)),
            last.and_then(Edge::pure_ratio)
                .map_or("-".into(), |r| format!("{r:.3}")),
            mean(&ratios).map_or("-".into(), |r| format!("{r:.3}")),
            last.map_or(String::new(), |e| escape(&e.stamps)),
            escape(&last_error(es))
        );
    }
    s.push_str("</table>\n");
    s
}

/// The most recent error of an edge, with its window, and whether the edge
/// has fitted since: a warm-up window's "no pure points" is history, not a
/// fault, once later windows fit.
fn last_error(es: &[&Edge]) -> String {
    let Some((at, error)) = es
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, e)| Some((i, e.error.as_deref()?)))
    else {
        return String::new();
    };
    let e = es[at];
    match es[at + 1..].iter().filter(|l| l.fit.is_some()).count() {
        0 => format!("{error} (window {})", e.window),
        n => format!("{error} (window {}; {n} fitted since)", e.window),
    }
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn graph_section(ctx: &Ctx) -> String {
    let mut s = String::from("<h2>Probe graph</h2>\n");
    let pairs = edges_by_pair(ctx.inp.history);
    if pairs.is_empty() {
        s.push_str("<p class=\"note\">No edge lines: the graph is unknown.</p>\n");
        return s;
    }
    s.push_str(&graph_svg(ctx, &pairs));
    s
}

const GRAPH: f64 = 520.0;

/// Nodes on a circle, each fitted out-edge an arrow (curved, so both
/// directions of a pair show).
fn graph_svg(ctx: &Ctx, pairs: &BTreeMap<(&str, &str), Vec<&Edge>>) -> String {
    let n = ctx.nodes.len().max(1) as f64;
    let (c, r) = (GRAPH / 2.0, GRAPH / 2.0 - 60.0);
    let at = |i: usize| {
        let a = std::f64::consts::TAU * i as f64 / n - std::f64::consts::FRAC_PI_2;
        (c + r * a.cos(), c + r * a.sin())
    };
    let pos = |name: &str| at(ctx.nodes.binary_search(&name).unwrap_or(0));
    let mut s = format!(
        r##"<svg class="graph" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {GRAPH} {GRAPH}" width="{GRAPH}" height="{GRAPH}">
<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="#555"/></marker></defs>
"##
    );
    for ((from, to), es) in pairs {
        s.push_str(&graph_edge(pos(from), pos(to), (from, to), es));
    }
    for (i, name) in ctx.nodes.iter().enumerate() {
        let (x, y) = at(i);
        let _ = writeln!(
            s,
            r##"<g class="node" data-node="{}"><circle cx="{x:.1}" cy="{y:.1}" r="16" fill="{}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="13">{}</text></g>"##,
            escape(name),
            ctx.colour_of(name),
            y + if y < c { -22.0 } else { 32.0 },
            escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn graph_edge(a: (f64, f64), b: (f64, f64), (from, to): (&str, &str), es: &[&Edge]) -> String {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len = dx.hypot(dy).max(1.0);
    let (ux, uy) = (dx / len, dy / len);
    // Start and end on the node circles (r = 16, plus a gap for the arrow).
    let (x1, y1) = (a.0 + ux * 18.0, a.1 + uy * 18.0);
    let (x2, y2) = (b.0 - ux * 18.0, b.1 - uy * 18.0);
    // Bend to the right of the direction of travel.
    let (mx, my) = ((x1 + x2) / 2.0 - uy * 18.0, (y1 + y2) / 2.0 + ux * 18.0);
    let last_rtt = es
        .iter()
        .rev()
        .find_map(|e| e.fit.as_ref())
        .map_or("no fit".into(), |f| format!("min RTT {} ns", f.min_rtt_ns));
    format!(
        "<g class=\"edge\" data-from=\"{}\" data-to=\"{}\"><path d=\"M{x1:.1},{y1:.1} Q{mx:.1},{my:.1} {x2:.1},{y2:.1}\" \
         fill=\"none\" stroke=\"#555\" stroke-width=\"1.3\" marker-end=\"url(#arrow)\"/><title>{}</title></g>\n",
        escape(from),
        escape(to),
        escape(&format!(
            "{from} → {to}: {} windows, last {last_rtt}",
            es.len()
        ))
    )
}

/// What `trace merge` did with each host: the offsets and bounds the
/// merged traces were placed with.
fn merge_section(name: &str, m: &MergeSummary) -> String {
    let mut s = String::from("<h2>Trace merge</h2>\n");
    let _ = writeln!(
        s,
        "<p class=\"note\">{}: run {}, origin {} ns, {} → {} bytes.</p>",
        escape(name),
        escape(&m.run_dir),
        m.origin_ns,
        m.bytes_in,
        m.bytes_out
    );
    s.push_str(
        "<table class=\"merge\"><tr><th>host</th><th>map from</th><th>anchors</th>\
         <th>offset at start</th><th>drift</th><th>worst bound</th><th>events placed</th>\
         <th>device planes</th></tr>\n",
    );
    for h in &m.hosts {
        let bound = h
            .worst_bound_ns
            .map_or_else(|| "unknown".to_string(), |b| format!("± {b} ns"));
        let devices: Vec<String> = h
            .device_planes
            .iter()
            .map(|d| {
                format!(
                    "{} ← {} (± {} ns)",
                    escape(&d.plane),
                    escape(&d.device),
                    d.worst_bound_ns
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "<tr data-host=\"{}\" data-offset-ns=\"{}\" data-drift-ppb=\"{}\" data-bound-ns=\"{}\">\
             <td class=\"name\">{}</td><td class=\"name\">{}</td><td>{}</td><td>{} ns</td>\
             <td>{:.1} ppb</td><td>{bound}</td><td>{}</td><td class=\"name\">{}</td></tr>",
            escape(&h.host),
            h.offset_ns,
            h.drift_ppb,
            h.worst_bound_ns.map_or_else(String::new, |b| b.to_string()),
            escape(&h.host),
            escape(&h.source),
            h.anchors,
            h.offset_ns,
            h.drift_ppb,
            h.events_placed,
            devices.join("<br>")
        );
    }
    s.push_str("</table>\n");
    s
}

fn device_section(ctx: &Ctx) -> String {
    let mut s = String::from("<h2>GPU device maps</h2>\n");
    let devices = &ctx.inp.history.devices;
    if devices.is_empty() {
        s.push_str(
            "<p class=\"note\">No device lines (the agent's <code>gpu_clock</code> was off).</p>\n",
        );
        return s;
    }
    let mut by: BTreeMap<(&str, &str), Vec<&DeviceHistoryEntry>> = BTreeMap::new();
    for d in devices {
        by.entry((d.host.as_str(), d.map.device.as_str()))
            .or_default()
            .push(d);
    }
    s.push_str(
        "<table class=\"devices\"><tr><th>host</th><th>device</th><th>source</th><th>device clock → host clock</th>\
         <th>maps</th><th>last window</th><th>offset at anchor</th><th>drift</th><th>bound</th>\
         <th>residual RMS</th><th>points</th></tr>\n",
    );
    for ((host, device), mut ds) in by {
        ds.sort_by_key(|d| (d.window, d.written_at_ns));
        let Some(last) = ds.last() else { continue };
        let m = &last.map;
        let _ = writeln!(
            s,
            "<tr data-host=\"{}\" data-device=\"{}\" data-maps=\"{}\" data-offset-ns=\"{}\" data-bound-ns=\"{}\">\
             <td class=\"name\">{}</td><td class=\"name\">{}</td><td class=\"name\">{}</td><td class=\"name\">{} → {}</td>\
             <td>{}</td><td>{}</td><td>{} ns</td><td>{:.1} ppb</td><td>{} ns</td><td>{:.1} ns</td><td>{}</td></tr>",
            escape(host),
            escape(device),
            ds.len(),
            m.offset_at_anchor_ns,
            m.bound_ns,
            escape(host),
            escape(device),
            escape(&m.source),
            escape(&m.device_domain),
            escape(&m.host_domain),
            ds.len(),
            last.window,
            m.offset_at_anchor_ns,
            m.drift_ppb,
            m.bound_ns,
            m.residual_rms_ns,
            m.points
        );
    }
    s.push_str("</table>\n");
    s
}

fn handover_section(ctx: &Ctx) -> String {
    let hs = &ctx.inp.history.handovers;
    if hs.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "<h2>Reference hand-overs</h2>\n<table class=\"handovers\"><tr><th>window</th><th>new reference</th>\
         <th>previous</th><th>carried offset</th><th>carried drift</th><th>carried bound</th>\
         <th>measured wander</th></tr>\n",
    );
    for h in hs.iter().filter(|h| h.is_hand_over()) {
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td class=\"name\">{}</td><td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            h.window,
            escape(&h.reference),
            escape(h.previous_reference.as_deref().unwrap_or("(new timeline)")),
            h.carried_offset_ns
                .map_or("-".into(), |o| format!("{o} ns")),
            h.carried_drift_ppb
                .map_or("-".into(), |d| format!("{d:.1} ppb")),
            h.carried_bound_ns.map_or("-".into(), |b| format!("{b} ns")),
            h.carried_wander_ppb_per_sqrt_s
                .map_or("-".into(), |w| format!("{w:.2} ppb/√s"))
        );
    }
    s.push_str("</table>\n");
    s.push_str(&steers_paragraph(hs));
    s
}

/// How often carried timelines were steered toward their origin's clock, and
/// the last bound (each a hand-over line of the same reference).
fn steers_paragraph(hs: &[crate::lines::HandOver]) -> String {
    let steers: Vec<_> = hs.iter().filter(|h| !h.is_hand_over()).collect();
    let Some(last) = steers.last() else {
        return String::new();
    };
    format!(
        "<p class=\"steers\"><span data-count=\"steers\">{}</span> windows steered a carried \
         timeline toward its origin's clock ({}); the last at window {}, bound {}.</p>\n",
        steers.len(),
        escape(last.steered_toward.as_deref().unwrap_or("")),
        last.window,
        last.carried_bound_ns
            .map_or("-".into(), |b| format!("{b} ns")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh_core::report::FitLine as EdgeFit;

    fn node(host: &str, window: u64, offset_ns: i64, bound_ns: u64) -> HistoryEntry {
        HistoryEntry {
            host: host.into(),
            window,
            anchor_ns: 1_000_000_000_000 + window as i64 * 4_000_000_000,
            offset_ns,
            drift_ppb: 12.5,
            bound_ns,
            reference: Some("r".into()),
            ..HistoryEntry::default()
        }
    }

    fn edge(from: &str, to: &str, window: u64) -> Edge {
        Edge {
            window,
            from: from.into(),
            to: to.into(),
            probes_forward: 10,
            probes_backward: 10,
            pure_forward: 5,
            pure_backward: 3,
            stamps: "software".into(),
            fit: Some(EdgeFit {
                anchor_ns: 1_000_000_000_000 + window as i64 * 4_000_000_000,
                min_rtt_ns: 41_000.5,
                bound_ns: 90.0,
                ..EdgeFit::default()
            }),
            ..Edge::default()
        }
    }

    fn page(h: &History, truth: Option<(&str, &Truth)>) -> String {
        let files = ["a.jsonl".to_string()];
        render(&Inputs {
            history: h,
            files: &files,
            truth,
            merge: None,
            collectives: None,
            critical: None,
        })
    }

    #[test]
    fn a_merge_summary_is_a_row_per_host_with_its_values() {
        use clockmesh_trace::summary::{DevicePlaneSummary, HostSummary};
        let host = |name: &str, bound: Option<u64>| HostSummary {
            host: name.into(),
            source: "history".into(),
            offset_ns: -123_906_768,
            drift_ppb: -50_003.4,
            worst_bound_ns: bound,
            anchors: 3,
            events_placed: 5_902,
            device_planes: vec![DevicePlaneSummary {
                plane: "/device:GPU:0".into(),
                device: "nvidia:0".into(),
                events_mapped: 7,
                worst_bound_ns: 2_100,
            }],
        };
        let m = MergeSummary {
            run_dir: "out/plugins/profile/r".into(),
            origin_ns: 42,
            bytes_in: 10,
            bytes_out: 11,
            hosts: vec![host("n1", Some(2_002)), host("<n2>", None)],
        };
        let h = History {
            nodes: vec![node("n1", 1, -1, 80)],
            ..History::default()
        };
        let files = ["a.jsonl".to_string()];
        let html = render(&Inputs {
            history: &h,
            files: &files,
            truth: None,
            merge: Some(("m.json", &m)),
            collectives: None,
            critical: None,
        });
        assert!(html.contains("<h2>Trace merge</h2>"));
        assert!(html.contains(r#"data-host="n1" data-offset-ns="-123906768" data-drift-ppb="-50003.4" data-bound-ns="2002""#), "{html}");
        assert!(html.contains(r#"data-host="&lt;n2&gt;""#) && html.contains("unknown"));
        assert!(html.contains("/device:GPU:0 ← nvidia:0 (± 2100 ns)"));
        assert!(!page(&h, None).contains("Trace merge"));
    }

    #[test]
    fn every_node_line_is_a_point_with_its_exact_values() {
        let h = History {
            nodes: vec![node("n1", 1, -1_234_567, 80), node("n1", 2, -1_234_000, 75)],
            ..History::default()
        };
        let html = page(&h, None);
        assert_eq!(html.matches(r#"class="pt offset""#).count(), 2);
        assert!(html.contains(r#"data-node="n1" data-window="1" data-t-ns="1004000000000" data-offset-ns="-1234567" data-bound-ns="80""#), "{html}");
        assert!(html.contains(r#"data-drift-ppb="12.5""#));
        assert!(html.contains("No edge lines"));
        assert!(html.contains("No truth given"));
        assert!(!html.contains("<script") && !html.contains("http://www.w3.org/2000/svg\" href"));
    }

    /// What n1 carried when it took n0's timeline over.
    fn carry_from_n0() -> clockmesh_core::timeline::Carry {
        clockmesh_core::timeline::Carry {
            anchor: clockmesh_core::time::LocalNs(1),
            offset: clockmesh_core::time::Nanos(-420),
            drift_ppb: 3.31,
            bound_ns: 1_498,
            from: "n0".into(),
        }
    }

    #[test]
    fn a_hand_over_row_shows_what_was_carried_and_the_wander_measured() {
        let carry = carry_from_n0();
        let mut line = crate::lines::HandOver::new(7, "n1", Some(&carry));
        line.carried_wander_ppb_per_sqrt_s = Some(1.1667);
        let h = History {
            nodes: vec![node("n1", 8, 5, 1)],
            handovers: vec![line, crate::lines::HandOver::new(2, "n0", None)],
            ..History::default()
        };
        let html = page(&h, None);
        assert!(
            html.contains("<td>-420 ns</td><td>3.3 ppb</td><td>1498 ns</td><td>1.17 ppb/√s</td>"),
            "{html}"
        );
        assert!(html.contains("(new timeline)</td><td>-</td><td>-</td><td>-</td><td>-</td>"));
    }

    #[test]
    fn steered_windows_are_counted_apart_from_the_hand_overs() {
        let carry = carry_from_n0();
        let steer = |window, bound_ns| crate::lines::HandOver {
            steered_toward: Some("n0".into()),
            ..crate::lines::HandOver::new(
                window,
                "n1",
                Some(&clockmesh_core::timeline::Carry {
                    bound_ns,
                    ..carry.clone()
                }),
            )
        };
        let h = History {
            nodes: vec![node("n1", 8, 5, 1)],
            handovers: vec![
                crate::lines::HandOver::new(7, "n1", Some(&carry)),
                steer(9, 300),
                steer(40, 250),
            ],
            ..History::default()
        };
        let html = page(&h, None);
        assert_eq!(html.matches("<tr><td>").count(), 1, "{html}");
        assert!(
            html.contains(r#"<span data-count="steers">2</span> windows steered"#),
            "{html}"
        );
        assert!(
            html.contains("the last at window 40, bound 250 ns"),
            "{html}"
        );
    }

    #[test]
    fn names_are_escaped_everywhere() {
        let bad = r#"<b>&"n"#;
        let h = History {
            nodes: vec![node(bad, 1, 5, 1)],
            edges: vec![edge(bad, "r", 1), edge("r", bad, 1)],
            ..History::default()
        };
        let html = page(&h, None);
        assert!(!html.contains(bad), "raw name leaked");
        assert!(!html.contains("<b>"), "raw name leaked");
        assert!(
            html.contains("data-node=\"&lt;b&gt;&amp;&quot;n\""),
            "{html}"
        );
        assert!(html.contains("data-from=\"&lt;b&gt;&amp;&quot;n\" data-to=\"r\""));
    }

    #[test]
    fn edges_make_points_a_table_and_arrows() {
        let h = History {
            edges: vec![edge("a", "b", 1), edge("a", "b", 2), edge("b", "a", 1)],
            ..History::default()
        };
        let html = page(&h, None);
        assert_eq!(html.matches(r#"class="pt rtt""#).count(), 3);
        assert_eq!(html.matches(r#"class="pt pure""#).count(), 3);
        assert!(html.contains(r#"data-min-rtt-ns="41000.5" data-pure-ratio="0.4""#));
        assert_eq!(html.matches("<g class=\"edge\"").count(), 2);
        assert_eq!(html.matches("<g class=\"node\"").count(), 2);
        assert!(html.contains("<tr data-from=\"a\" data-to=\"b\"><td class=\"name\">a</td><td class=\"name\">b</td><td>2</td><td>2</td><td>41.001 µs</td>"), "{html}");
    }

    #[test]
    fn an_edge_error_says_whether_the_edge_fitted_since() {
        let failed = |window| Edge {
            error: Some("no pure points".into()),
            fit: None,
            ..edge("a", "b", window)
        };
        let (w1, w2, w3) = (failed(1), edge("a", "b", 2), edge("a", "b", 3));
        assert_eq!(
            last_error(&[&w1, &w2, &w3]),
            "no pure points (window 1; 2 fitted since)"
        );
        let w4 = failed(4);
        assert_eq!(
            last_error(&[&w1, &w2, &w3, &w4]),
            "no pure points (window 4)"
        );
        assert_eq!(last_error(&[&w2, &w3]), "");
    }

    #[test]
    fn errors_against_the_truth_are_estimated_minus_true() {
        let truth = Truth::parse(
            "t.json",
            r#"{"nodes": {"r": {"offset_ns": 0, "drift_ppb": 0, "epoch_ns": 0},
                          "n1": {"offset_ns": 1000, "drift_ppb": 0, "epoch_ns": 0}}}"#,
        )
        .unwrap();
        let h = History {
            nodes: vec![node("n1", 1, -990, 20), node("n2", 1, 5, 1)],
            ..History::default()
        };
        let html = page(&h, Some(("t.json", &truth)));
        assert_eq!(html.matches(r#"class="pt error""#).count(), 1);
        assert!(
            html.contains(r#"data-error-ns="10" data-true-ns="-1000""#),
            "{html}"
        );
        assert!(html.contains("1 of 2 node lines"));
        assert!(html.contains("<td>100.0 %</td>"));
    }
}
