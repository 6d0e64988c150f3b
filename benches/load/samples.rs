//! What one timed slice of closed-loop calls produced, and the summary of many slices.

use std::time::Duration;

/// One slice: `clients` callers looping for a fixed time.
#[derive(Debug, Default, Clone)]
pub struct Slice {
    /// Latency of every successful call, in microseconds.
    pub latencies_us: Vec<u64>,
    pub errors: u64,
    /// From the slice's start until its last caller finished its last call.
    pub elapsed: Duration,
    pub first_error: Option<String>,
    /// CPU seconds (user, system) the hop's process (nginx or the gateway) used during the
    /// slice; zeros on the direct path.
    pub hop_cpu: (f64, f64),
    /// CPU seconds (user + system) this process used during the slice: the clients, and the
    /// in-process legacy server.
    pub load_cpu: f64,
}

impl Slice {
    pub fn throughput(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn merge(&mut self, other: Slice) {
        self.latencies_us.extend(other.latencies_us);
        self.errors += other.errors;
        self.elapsed = self.elapsed.max(other.elapsed);
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Many slices of one scenario, pooled.
#[derive(Debug, Clone)]
pub struct Summary {
    pub calls: u64,
    pub errors: u64,
    pub throughput: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub first_error: Option<String>,
    /// Throughput of each slice, in run order.
    pub per_slice: Vec<f64>,
    /// The hop's CPU per successful call, microseconds (user, system); zero on the direct path.
    pub hop_cpu_us_per_call: (f64, f64),
    /// This process's CPU (the clients and the legacy server) per successful call, µs.
    pub load_cpu_us_per_call: f64,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

pub fn summarize(slices: &[Slice]) -> Summary {
    let mut all: Vec<u64> = slices
        .iter()
        .flat_map(|s| s.latencies_us.iter().copied())
        .collect();
    all.sort_unstable();
    let elapsed: f64 = slices.iter().map(|s| s.elapsed.as_secs_f64()).sum();
    let mean_ms = if all.is_empty() {
        f64::NAN
    } else {
        all.iter().sum::<u64>() as f64 / all.len() as f64 / 1000.0
    };
    Summary {
        calls: all.len() as u64,
        errors: slices.iter().map(|s| s.errors).sum(),
        throughput: all.len() as f64 / elapsed.max(1e-9),
        p50_ms: percentile(&all, 50.0),
        p99_ms: percentile(&all, 99.0),
        mean_ms,
        first_error: slices.iter().find_map(|s| s.first_error.clone()),
        per_slice: slices.iter().map(Slice::throughput).collect(),
        hop_cpu_us_per_call: {
            let calls = all.len().max(1) as f64;
            let user: f64 = slices.iter().map(|s| s.hop_cpu.0).sum();
            let sys: f64 = slices.iter().map(|s| s.hop_cpu.1).sum();
            (user * 1e6 / calls, sys * 1e6 / calls)
        },
        load_cpu_us_per_call: slices.iter().map(|s| s.load_cpu).sum::<f64>() * 1e6
            / all.len().max(1) as f64,
    }
}

/// The median of `values` (NaN when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}
