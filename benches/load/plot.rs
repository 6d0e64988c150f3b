//! The `--sweep` figures: a table, and an SVG with two panels against the number of clients
//! (plain call throughput of the three paths; the gateway's p50 and p99). Hand-written SVG: a
//! few lines and labels need no plotting library.

use std::fmt::Write;

/// The plain call at one number of clients.
pub struct Point {
    pub clients: usize,
    pub direct: f64,
    pub nginx: f64,
    pub gateway: f64,
    pub gateway_p50_ms: f64,
    pub gateway_p99_ms: f64,
    /// CPU (user + system) of each hop's own process per call, µs.
    pub nginx_cpu_us: f64,
    pub gateway_cpu_us: f64,
    /// CPU of the bench's own process (its clients and the legacy server) per call on the
    /// direct path, µs: what the machine spends per call before any hop.
    pub direct_load_cpu_us: f64,
}

pub fn table(points: &[Point]) -> String {
    let mut out = String::from(
        "plain tools/call by clients\n  clients   direct/s    nginx/s  gateway/s  gateway/nginx  gateway p50 ms  p99 ms  p99/p50  vs first  nginx vs first  direct vs first  nginx µs/call  gateway µs/call  direct load µs/call\n",
    );
    // Growth is read against the first point; nginx's and direct's own columns show what the
    // machine allows (the bench's clients and the legacy server share its cores with every
    // hop), and the CPU columns whether a hop's own cost per call grows with the clients.
    let first = points.first().map_or(1.0, |p| p.gateway);
    let nginx_first = points.first().map_or(1.0, |p| p.nginx);
    let direct_first = points.first().map_or(1.0, |p| p.direct);
    for p in points {
        let _ = writeln!(
            out,
            "  {:>7} {:>10.0} {:>10.0} {:>10.0} {:>14.2} {:>15.2} {:>7.2} {:>8.2} {:>9.2} {:>15.2} {:>16.2} {:>14.1} {:>16.1} {:>20.1}",
            p.clients,
            p.direct,
            p.nginx,
            p.gateway,
            p.gateway / p.nginx.max(1e-9),
            p.gateway_p50_ms,
            p.gateway_p99_ms,
            p.gateway_p99_ms / p.gateway_p50_ms.max(1e-9),
            p.gateway / first.max(1e-9),
            p.nginx / nginx_first.max(1e-9),
            p.direct / direct_first.max(1e-9),
            p.nginx_cpu_us,
            p.gateway_cpu_us,
            p.direct_load_cpu_us,
        );
    }
    out
}

const W: f64 = 720.0;
const PANEL_H: f64 = 220.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const GAP: f64 = 70.0;

/// One line of a panel: its label, colour and values (one per point).
struct Series<'a> {
    label: &'a str,
    colour: &'a str,
    values: Vec<f64>,
}

pub fn svg(points: &[Point]) -> String {
    let h = TOP + 2.0 * PANEL_H + GAP + 50.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"20\" font-size=\"14\">mrtr-load --sweep: plain tools/call against the number of clients</text>\n"
    );
    let throughput = [
        Series {
            label: "direct",
            colour: "#888888",
            values: points.iter().map(|p| p.direct).collect(),
        },
        Series {
            label: "nginx",
            colour: "#2a7ab0",
            values: points.iter().map(|p| p.nginx).collect(),
        },
        Series {
            label: "gateway",
            colour: "#c0392b",
            values: points.iter().map(|p| p.gateway).collect(),
        },
    ];
    panel(&mut out, points, TOP, "calls/s", &throughput);
    let latency = [
        Series {
            label: "gateway p50",
            colour: "#e67e22",
            values: points.iter().map(|p| p.gateway_p50_ms).collect(),
        },
        Series {
            label: "gateway p99",
            colour: "#c0392b",
            values: points.iter().map(|p| p.gateway_p99_ms).collect(),
        },
    ];
    panel(&mut out, points, TOP + PANEL_H + GAP, "ms", &latency);
    out.push_str("</svg>\n");
    out
}

/// One panel at `top`: axes, `unit` on the y axis, the clients on the x axis (evenly spaced),
/// a line per series with its label at the right.
fn panel(out: &mut String, points: &[Point], top: f64, unit: &str, series: &[Series]) {
    let width = W - LEFT - RIGHT;
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max)
        .max(1e-9)
        * 1.1;
    let x = |i: usize| {
        if points.len() < 2 {
            LEFT + width / 2.0
        } else {
            LEFT + width * i as f64 / (points.len() - 1) as f64
        }
    };
    let y = |v: f64| top + PANEL_H - PANEL_H * (v / max);
    let bottom = top + PANEL_H;
    let _ = writeln!(
        out,
        "<line x1=\"{LEFT}\" y1=\"{top}\" x2=\"{LEFT}\" y2=\"{bottom}\" stroke=\"black\"/>\n\
         <line x1=\"{LEFT}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\" stroke=\"black\"/>\n\
         <text x=\"10\" y=\"{}\">{unit}</text>",
        LEFT + width,
        top + 12.0
    );
    for k in 0..=4 {
        let v = max * f64::from(k) / 4.0;
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n\
             <line x1=\"{LEFT}\" y1=\"{:.1}\" x2=\"{}\" y2=\"{:.1}\" stroke=\"#eeeeee\"/>",
            LEFT - 6.0,
            y(v) + 4.0,
            short(v),
            y(v),
            LEFT + width,
            y(v)
        );
    }
    for (i, p) in points.iter().enumerate() {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{} clients</text>",
            x(i),
            bottom + 18.0,
            p.clients
        );
    }
    for s in series {
        let path: Vec<String> = s
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect();
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>",
            s.colour,
            path.join(" ")
        );
        for (i, v) in s.values.iter().enumerate() {
            let _ = writeln!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{}\"/>",
                x(i),
                y(*v),
                s.colour
            );
        }
        if let Some(last) = s.values.last() {
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{}\">{} {}</text>",
                LEFT + width + 8.0,
                y(*last) + 4.0,
                s.colour,
                s.label,
                short(*last)
            );
        }
    }
}

/// 12,345 as "12.3k", 456.7 as "457", 4.56 as "4.6".
fn short(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}
