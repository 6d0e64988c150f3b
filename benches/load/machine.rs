//! What the bench ran on, printed with every result: the ratios against nginx depend on the
//! machine, not only on the gateway. nginx's cost per call is almost all kernel time (two
//! sockets, no parsing), the gateway's is mostly its own code, so a machine whose system calls
//! cost more moves nginx's figure more than the gateway's (the tenth session measured nginx at
//! 24.7–29.7 µs per call on one machine, where the machine gave 11.8 µs).

use std::path::Path;

/// The CPU's model, the kernel's release, the CPUs this process may use, nginx's version.
pub struct Machine {
    pub cpu_model: String,
    pub kernel: String,
    pub cpus: usize,
    pub nginx: String,
}

impl Machine {
    /// Reads the machine; a part it cannot read is "unknown".
    pub fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            cpu_model: cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".into()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            nginx: mrtr_testkit::nginx::binary()
                .ok()
                .and_then(|b| nginx_version(&b))
                .unwrap_or_else(|| "unknown".into()),
        }
    }

    /// One phrase for the setup line.
    pub fn describe(&self) -> String {
        format!(
            "{} CPUs ({}), kernel {}, {}",
            self.cpus, self.cpu_model, self.kernel, self.nginx
        )
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "cpus": self.cpus,
            "cpu_model": self.cpu_model,
            "kernel": self.kernel,
            "nginx": self.nginx,
        })
    }
}

/// The first `model name` of `/proc/cpuinfo`'s text.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "model name").then(|| value.trim().to_string())
    })
}

/// `nginx -v` writes `nginx version: nginx/1.22.1` to stderr.
fn nginx_version(binary: &Path) -> Option<String> {
    let out = std::process::Command::new(binary).arg("-v").output().ok()?;
    let text = String::from_utf8_lossy(&out.stderr);
    let version = text.trim().strip_prefix("nginx version: ")?;
    Some(version.to_string())
}
