//! One legacy session over stdio: a child process speaking newline-delimited JSON-RPC.
//!
//! One child is exactly one session. [`StdioSession::spawn`] starts the command, sends
//! `initialize` and `notifications/initialized`, and hands back the session with the channel
//! its messages arrive on: the response to a request of ours as `Call(id)`, everything else
//! (server requests, notifications) as `Get`, since stdio has a single stream.
//!
//! A *driver* task owns the child: it reads stdout line by line (each line at most
//! `upstream.max_line_bytes`), logs stderr (target `legacy_stderr`, with the pid), and watches
//! for the child's end. The child is killed, and never used again, when it
//! - exits or closes stdout: every request in flight ends with an error such as "the legacy
//!   process (pid 42) exited with status 1 during tools/call" (plus its last stderr line);
//! - writes a line that is not JSON, not UTF-8, or longer than the cap;
//! - stays silent for `upstream.idle_timeout` while a request of ours is in flight, or does
//!   not answer `initialize` within `upstream.response_timeout`, or stops reading stdin.
//!
//! [`StdioSession::close`] ends a child gently: stdin is closed (a stdio server's signal to
//! exit), then after `upstream.stdio_shutdown_grace` SIGTERM, after another grace SIGKILL.
//! Dropping a session kills its child; `kill_on_drop` is the last resort should the driver
//! itself be dropped (runtime shutdown), so no child outlives the gateway.
//!
//! Nothing about one call is kept once its response has arrived (or it was cancelled), so a
//! pool may hand one healthy session ([`StdioSession::is_healthy`]) to several calls in turn.
//!
//! The child's environment is not the gateway's: it gets [`INHERITED_ENV`] (when set) plus
//! `upstream.env`, so the gateway's own secrets (state keys in `MRTR_GATEWAY__…`, cloud
//! credentials) do not leak into a third-party server.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use super::handshake::{self, VersionMemory, initialize_params};
use super::pending::{PendingCalls, Reply};
use super::session::{Inbound, SessionError};
use super::wire::{excerpt, messages_of};
use crate::metrics::LimitHits;
use mrtr_wire::jsonrpc;

const CHANNEL_DEPTH: usize = 256;
/// stderr lines are logged in pieces of at most this many bytes.
const MAX_STDERR_LINE: usize = 8 * 1024;
/// How long a SIGKILLed child may take to be reaped before the driver stops waiting.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Variables the child inherits from the gateway's environment (when set there).
pub const INHERITED_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME",
];

/// How to start a child and the limits it runs under.
#[derive(Debug, Clone)]
pub struct StdioSpec {
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub max_line_bytes: usize,
    pub response_timeout: Duration,
    pub idle_timeout: Duration,
    pub shutdown_grace: Duration,
    pub client_name: String,
    pub hits: LimitHits,
}

impl StdioSpec {
    /// The command line, for logs and errors.
    pub fn describe(&self) -> String {
        self.command
            .iter()
            .map(|a| {
                if a.is_empty() || a.contains(char::is_whitespace) {
                    format!("{a:?}")
                } else {
                    a.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.command[0]);
        cmd.args(&self.command[1..]).env_clear();
        for name in INHERITED_ENV {
            if let Some(v) = std::env::var_os(name) {
                cmd.env(name, v);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }
}

/// What the session and its driver share.
#[derive(Default)]
struct Shared {
    calls: PendingCalls,
    last_stderr: Mutex<Option<String>>,
}

enum Control {
    /// End the child gently.
    Close,
    /// Kill the child now, for this reason.
    Kill(String),
}

pub struct StdioSession {
    /// The legacy `InitializeResult`, as received.
    pub init_result: std::sync::Arc<Value>,
    /// The version the server chose.
    pub negotiated_version: String,
    pid: u32,
    next_id: i64,
    stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    shared: Arc<Shared>,
    control: mpsc::UnboundedSender<Control>,
    driver: Option<JoinHandle<()>>,
    response_timeout: Duration,
    shutdown_grace: Duration,
    /// Decremented when the session ends (the gateway's "sessions open now" gauge).
    active: Option<prometheus::IntGauge>,
}

impl StdioSession {
    /// Starts a child, initializes it declaring `capabilities`, and returns the session.
    /// `permit` (a slot of `upstream.stdio_max_children`) is held until the child is gone.
    pub async fn spawn(
        spec: &StdioSpec,
        versions: &VersionMemory,
        capabilities: Value,
        permit: OwnedSemaphorePermit,
    ) -> Result<(StdioSession, mpsc::Receiver<Inbound>), SessionError> {
        let mut child = spec
            .command()
            .spawn()
            .map_err(|e| SessionError::Spawn(format!("cannot start `{}`: {e}", spec.describe())))?;
        let pid = child.id().unwrap_or_default();
        let stdin = Arc::new(tokio::sync::Mutex::new(child.stdin.take()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        let (control, control_rx) = mpsc::unbounded_channel();
        tracing::debug!(pid, command = %spec.describe(), "legacy process started");
        let driver = Driver {
            child,
            pid,
            stdout: FramedRead::new(stdout, LinesCodec::new_with_max_length(spec.max_line_bytes)),
            stdout_done: false,
            stdin: stdin.clone(),
            stderr_task: Some(tokio::spawn(log_stderr(stderr, pid, shared.clone()))),
            control: control_rx,
            shared: shared.clone(),
            tx,
            spec: spec.clone(),
            _permit: permit,
        };
        let mut session = StdioSession {
            init_result: std::sync::Arc::new(Value::Null),
            negotiated_version: String::new(),
            pid,
            next_id: 1,
            stdin,
            shared,
            control,
            driver: Some(tokio::spawn(driver.run())),
            response_timeout: spec.response_timeout,
            shutdown_grace: spec.shutdown_grace,
            active: None,
        };
        match session.initialize(spec, versions, capabilities).await {
            Ok(()) => Ok((session, rx)),
            Err(e) => {
                session.end(Control::Kill(e.to_string())).await;
                Err(e)
            }
        }
    }

    async fn initialize(
        &mut self,
        spec: &StdioSpec,
        versions: &VersionMemory,
        capabilities: Value,
    ) -> Result<(), SessionError> {
        let params =
            initialize_params(&versions.request_version(), capabilities, &spec.client_name);
        let (reply_tx, reply_rx) = oneshot::channel();
        self.register(0, "initialize", Some(reply_tx))?;
        self.send(&jsonrpc::OutgoingRequest::new(
            0,
            "initialize",
            Some(&params),
        ))
        .await?;
        let answer = match timeout(self.response_timeout, reply_rx).await {
            Err(_) => {
                return Err(SessionError::Initialize(format!(
                    "the legacy process (pid {}) did not answer initialize within {:?} (upstream.response_timeout)",
                    self.pid, self.response_timeout
                )));
            }
            Ok(Err(_)) => {
                return Err(SessionError::Initialize(
                    "the legacy process's driver ended".into(),
                ));
            }
            Ok(Ok(Err(what))) => return Err(SessionError::Initialize(what)),
            Ok(Ok(Ok(msg))) => msg,
        };
        let done = handshake::accept(&answer, versions)?;
        self.negotiated_version = done.negotiated_version;
        self.init_result = done.init_result;
        self.notify("notifications/initialized", None).await
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Counts this session in `gauge` until it ends.
    pub fn track_with(&mut self, gauge: prometheus::IntGauge) {
        gauge.inc();
        self.active = Some(gauge);
    }

    /// Whether the child is alive and has done nothing wrong, so another call may use it.
    pub fn is_healthy(&self) -> bool {
        self.shared.calls.gone().is_none() && self.driver.as_ref().is_some_and(|d| !d.is_finished())
    }

    fn register(&self, id: i64, method: &str, reply: Option<Reply>) -> Result<(), SessionError> {
        self.shared
            .calls
            .register(id, method, reply)
            .map_err(SessionError::Gone)
    }

    /// Writes one message as one line on the child's stdin.
    async fn send(&self, msg: &impl serde::Serialize) -> Result<(), SessionError> {
        let mut line = serde_json::to_vec(msg).expect("JSON-RPC messages serialize");
        line.push(b'\n');
        let mut stdin = self.stdin.lock().await;
        let gone = || {
            self.shared
                .calls
                .gone()
                .unwrap_or_else(|| format!("the legacy process (pid {}) is gone", self.pid))
        };
        let Some(pipe) = stdin.as_mut() else {
            return Err(SessionError::Gone(gone()));
        };
        let write = async {
            pipe.write_all(&line).await?;
            pipe.flush().await
        };
        match timeout(self.response_timeout, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(SessionError::Gone(format!(
                "{} (writing to its stdin failed: {e})",
                gone()
            ))),
            Err(_) => {
                let what = format!(
                    "the legacy process (pid {}) did not read its stdin for {:?} (upstream.response_timeout)",
                    self.pid, self.response_timeout
                );
                let _ = self.control.send(Control::Kill(what.clone()));
                Err(SessionError::Gone(what))
            }
        }
    }

    /// Sends a request; its response arrives tagged `Call(id)`. Returns the id.
    pub async fn request<P: serde::Serialize + Sync + ?Sized>(
        &mut self,
        method: &str,
        params: Option<&P>,
    ) -> Result<i64, SessionError> {
        let id = self.next_id;
        self.next_id += 1;
        self.register(id, method, None)?;
        if let Err(e) = self
            .send(&jsonrpc::OutgoingRequest::new(id, method, params))
            .await
        {
            self.shared.calls.forget(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Answers a server request.
    pub async fn respond(
        &self,
        id: &Value,
        outcome: Result<Value, jsonrpc::ErrorObject>,
    ) -> Result<(), SessionError> {
        let msg = match outcome {
            Ok(result) => jsonrpc::result_response(id, result),
            Err(e) => jsonrpc::error_response(Some(id), &e),
        };
        self.send(&msg).await
    }

    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), SessionError> {
        self.send(&jsonrpc::notification(method, params)).await
    }

    /// Asks the child to stop working on request `id`, and forgets the request: a late
    /// response to it is dropped, so the session is clean for the next call.
    pub async fn cancel(&self, id: i64, reason: &str) -> Result<(), SessionError> {
        self.shared.calls.forget(id);
        self.notify(
            "notifications/cancelled",
            Some(json!({"requestId": id, "reason": reason})),
        )
        .await
    }

    /// Ends the session gently (stdin closed, then SIGTERM, then SIGKILL, each after
    /// `upstream.stdio_shutdown_grace`); returns once the child is gone.
    pub async fn close(mut self) {
        self.end(Control::Close).await;
    }

    /// Kills the child now.
    pub async fn kill(mut self, reason: &str) {
        self.end(Control::Kill(reason.to_string())).await;
    }

    async fn end(&mut self, how: Control) {
        if let Some(g) = self.active.take() {
            g.dec();
        }
        let _ = self.control.send(how);
        if let Some(driver) = self.driver.take() {
            // The driver's own waits are bounded; this only guards against a stuck channel.
            let limit = self.shutdown_grace * 2 + KILL_WAIT * 2;
            if timeout(limit, driver).await.is_err() {
                tracing::warn!(
                    pid = self.pid,
                    "legacy process driver did not finish; the child is killed on drop"
                );
            }
        }
    }
}

impl Drop for StdioSession {
    fn drop(&mut self) {
        // The driver sees the control channel close and kills the child.
        if let Some(g) = self.active.take() {
            g.dec();
        }
    }
}

/// Owns the child: reads its stdout, watches its exit, kills it when needed.
struct Driver {
    child: Child,
    pid: u32,
    stdout: FramedRead<ChildStdout, LinesCodec>,
    stdout_done: bool,
    stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    stderr_task: Option<JoinHandle<()>>,
    control: mpsc::UnboundedReceiver<Control>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Inbound>,
    spec: StdioSpec,
    /// The `upstream.stdio_max_children` slot, released when the driver ends.
    _permit: OwnedSemaphorePermit,
}

/// How a child's life ended.
enum Ending {
    /// `close()`: stdin closed, the child asked to exit.
    Closed,
    /// The child misbehaved or was given up on; kill it.
    Kill(String),
    /// The session was dropped without being closed (its caller went away); kill the child.
    Dropped,
    /// The child exited (or closed stdout) on its own.
    Exited(String),
}

impl Driver {
    async fn run(mut self) {
        let ending = self.watch().await;
        let what = match ending {
            Ending::Closed => {
                self.shut_down().await;
                None
            }
            Ending::Kill(reason) => {
                let _ = self.child.start_kill();
                let _ = timeout(KILL_WAIT, self.child.wait()).await;
                Some(reason)
            }
            Ending::Dropped => {
                tracing::debug!(
                    pid = self.pid,
                    "legacy session dropped; killing its process"
                );
                let _ = self.child.start_kill();
                let _ = timeout(KILL_WAIT, self.child.wait()).await;
                None
            }
            Ending::Exited(what) => Some(what),
        };
        // The last stderr lines often say why; wait (briefly) for them.
        if let Some(mut task) = self.stderr_task.take()
            && timeout(self.spec.shutdown_grace, &mut task).await.is_err()
        {
            // A grandchild still holds stderr open: stop listening to it.
            task.abort();
        }
        let detail = match self.shared.last_stderr.lock().ok().and_then(|l| l.clone()) {
            Some(line) if what.is_some() => format!(" (last stderr line: {})", excerpt(&line, 300)),
            _ => String::new(),
        };
        match &what {
            Some(w) => {
                tracing::warn!(pid = self.pid, command = %self.spec.describe(), "legacy process ended: {w}{detail}");
            }
            None => tracing::debug!(pid = self.pid, "legacy process closed"),
        }
        let closed = format!("the legacy process (pid {}) was closed", self.pid);
        self.shared
            .calls
            .fail_all(what, &detail, &closed, &self.tx)
            .await;
    }

    /// Runs until the child's life is over, forwarding its messages.
    async fn watch(&mut self) -> Ending {
        let mut last_line = Instant::now();
        loop {
            let idle_deadline = self.idle_deadline(last_line);
            tokio::select! {
                ctl = self.control.recv() => return match ctl {
                    Some(Control::Close) => Ending::Closed,
                    Some(Control::Kill(reason)) => Ending::Kill(reason),
                    None => Ending::Dropped,
                },
                line = self.stdout.next(), if !self.stdout_done => match line {
                    Some(Ok(text)) => {
                        last_line = Instant::now();
                        if let Err(what) = self.on_line(&text).await {
                            return Ending::Kill(what);
                        }
                    }
                    Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                        self.spec.hits.hit(crate::metrics::Limit::UpstreamMaxLineBytes);
                        return Ending::Kill(format!(
                            "the legacy process (pid {}) wrote a stdout line longer than {} bytes (upstream.max_line_bytes)",
                            self.pid, self.spec.max_line_bytes
                        ));
                    }
                    Some(Err(LinesCodecError::Io(e))) => {
                        return Ending::Kill(format!(
                            "reading the legacy process's (pid {}) stdout failed: {e}",
                            self.pid
                        ));
                    }
                    None => {
                        self.stdout_done = true;
                        return match timeout(self.spec.shutdown_grace, self.child.wait()).await {
                            Ok(Ok(status)) => Ending::Exited(describe_exit(self.pid, status)),
                            _ => Ending::Kill(format!("the legacy process (pid {}) closed its stdout", self.pid)),
                        };
                    }
                },
                status = self.child.wait() => {
                    // Responses written just before the exit are still in the pipe.
                    self.drain_stdout().await;
                    return match status {
                        Ok(status) => Ending::Exited(describe_exit(self.pid, status)),
                        Err(e) => Ending::Kill(format!("waiting for the legacy process (pid {}) failed: {e}", self.pid)),
                    };
                }
                _ = sleep_until(idle_deadline.unwrap_or_else(far_future)), if idle_deadline.is_some() => {
                    return Ending::Kill(format!(
                        "the legacy process (pid {}) sent nothing for {:?} (upstream.idle_timeout)",
                        self.pid, self.spec.idle_timeout
                    ));
                }
                _ = self.shared.calls.sent.notified() => {} // a request went out: re-arm the idle clock
            }
        }
    }

    /// While a request of ours is in flight, when silence becomes a hang.
    fn idle_deadline(&self, last_line: Instant) -> Option<Instant> {
        let sent = self.shared.calls.busy_since()?;
        Some(sent.max(last_line) + self.spec.idle_timeout)
    }

    /// Forwards what one stdout line carries. `Err` when the line is not JSON-RPC.
    async fn on_line(&mut self, text: &str) -> Result<(), String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(());
        }
        let messages = messages_of(text).map_err(|_| {
            format!(
                "the legacy process (pid {}) wrote a line that is not JSON-RPC: {:?}",
                self.pid,
                excerpt(text, 120)
            )
        })?;
        for m in messages {
            let _ = self.shared.calls.route(m, &self.tx).await;
        }
        Ok(())
    }

    /// Reads what is left on stdout after the child exited (bounded: a grandchild may hold it).
    async fn drain_stdout(&mut self) {
        let deadline = Instant::now() + self.spec.shutdown_grace;
        while !self.stdout_done {
            match tokio::time::timeout_at(deadline, self.stdout.next()).await {
                Ok(Some(Ok(text))) => {
                    if self.on_line(&text).await.is_err() {
                        return;
                    }
                }
                Ok(None) => self.stdout_done = true,
                Ok(Some(Err(_))) | Err(_) => return,
            }
        }
    }

    /// stdin closed, then SIGTERM, then SIGKILL, each after the grace period.
    async fn shut_down(&mut self) {
        self.stdin.lock().await.take();
        if self.wait_exit(self.spec.shutdown_grace).await {
            return;
        }
        if let Some(pid) = self.child.id() {
            tracing::debug!(
                pid,
                "legacy process still running after stdin closed; SIGTERM"
            );
            if let Err(e) = terminate(pid) {
                tracing::debug!(pid, error = %e, "SIGTERM failed");
            }
            if self.wait_exit(self.spec.shutdown_grace).await {
                return;
            }
        }
        tracing::warn!(
            pid = self.pid,
            "legacy process ignored stdin closing and SIGTERM; killing it"
        );
        let _ = self.child.start_kill();
        let _ = timeout(KILL_WAIT, self.child.wait()).await;
    }

    /// Waits up to `within` for the child to exit, discarding its output meanwhile (so a
    /// child blocked on a full stdout pipe can get to its exit).
    async fn wait_exit(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            tokio::select! {
                status = self.child.wait() => return status.is_ok(),
                line = self.stdout.next(), if !self.stdout_done => {
                    if line.is_none() {
                        self.stdout_done = true;
                    }
                }
                _ = sleep_until(deadline) => return false,
            }
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}

fn describe_exit(pid: u32, status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("the legacy process (pid {pid}) exited with status {code}"),
        (None, Some(sig)) => format!("the legacy process (pid {pid}) was killed by signal {sig}"),
        _ => format!("the legacy process (pid {pid}) exited ({status})"),
    }
}

/// SIGTERM to a child not yet reaped (so its pid cannot have been reused).
fn terminate(pid: u32) -> std::io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| std::io::Error::other("not a process id"))?;
    rustix::process::kill_process(pid, rustix::process::Signal::Term).map_err(Into::into)
}

/// Logs the child's stderr, line by line, at info with target `legacy_stderr`.
async fn log_stderr(stderr: ChildStderr, pid: u32, shared: Arc<Shared>) {
    let mut reader = BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match (&mut reader)
            .take(MAX_STDERR_LINE as u64)
            .read_until(b'\n', &mut buf)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&buf);
        let line = text.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            continue;
        }
        tracing::info!(target: "legacy_stderr", pid, "{line}");
        if let Ok(mut last) = shared.last_stderr.lock() {
            *last = Some(line.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` the way the driver reads stdout.
    async fn lines(input: &[u8], max: usize) -> Vec<Result<String, String>> {
        let mut framed = FramedRead::new(input, LinesCodec::new_with_max_length(max));
        let mut out = Vec::new();
        while let Some(item) = framed.next().await {
            let failed = item.is_err();
            out.push(item.map_err(|e| e.to_string()));
            if failed {
                break;
            }
        }
        out
    }

    #[tokio::test]
    async fn stdout_lines_are_capped() {
        let ok = lines(b"{\"a\":1}\r\n{\"b\":2}\n", 16).await;
        assert_eq!(ok, vec![Ok("{\"a\":1}".into()), Ok("{\"b\":2}".into())]);
        // Exactly at the cap is fine; one byte over is refused before the newline arrives.
        let at_cap = format!("{}\n", "x".repeat(16));
        assert_eq!(lines(at_cap.as_bytes(), 16).await, vec![Ok("x".repeat(16))]);
        let over = "y".repeat(17);
        let got = lines(over.as_bytes(), 16).await;
        assert_eq!(got.len(), 1);
        assert!(
            got[0].as_ref().unwrap_err().contains("max line length"),
            "{got:?}"
        );
    }

    #[test]
    fn command_lines_quote_what_needs_it() {
        let spec = StdioSpec {
            command: vec!["python3".into(), "my server.py".into(), "--x".into()],
            env: Vec::new(),
            cwd: None,
            max_line_bytes: 1,
            response_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(1),
            client_name: "t".into(),
            hits: LimitHits::none(),
        };
        assert_eq!(spec.describe(), "python3 \"my server.py\" --x");
    }
}
