//! The command line shared by the release binary (`src/main.rs`) and the demo binary
//! (`src/bin/demo.rs`): parse, load configuration, start logging, hand over to the library.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::commands::{self, EXIT_CONFIG};
use clap::{Parser, Subcommand};
use mrtr_gateway::config::Config;

#[derive(Parser)]
#[command(
    name = "mrtr-gateway",
    version,
    about = "A stateless MCP 2026-07-28 gateway for legacy MCP servers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve {
        /// The TOML configuration file.
        #[arg(long, env = "MRTR_GATEWAY_CONFIG")]
        config: PathBuf,
    },
    /// Run a built-in legacy server, the gateway and a scripted client through a multi-round flow.
    Demo,
    /// Print a fresh state key as a `[[state.keys]]` TOML entry, or, with `--dir`, write it
    /// into a `state.keys_dir` directory as a date-named file (mode 0600) and print its path.
    Keygen {
        /// The key directory (`state.keys_dir`); the new key becomes the sealing key.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Validate a configuration file (exit 0), or name the bad key (exit 64).
    CheckConfig {
        #[arg(long, env = "MRTR_GATEWAY_CONFIG")]
        config: PathBuf,
        /// Print the effective configuration (file + environment + defaults), secrets redacted.
        #[arg(long)]
        print: bool,
    },
    /// Open a requestState with the configured keys and print its non-secret fields.
    InspectState {
        #[arg(long, env = "MRTR_GATEWAY_CONFIG")]
        config: PathBuf,
        /// Also print the answers it carries (user data).
        #[arg(long)]
        show_answers: bool,
        /// The requestState token ("-" reads it from standard input).
        state: String,
    },
}

/// The runtime the gateway's tasks run on: `worker_threads` of them, or (`None`) one per CPU
/// the process may use, as tokio counts them (a cgroup CPU limit counts).
pub fn runtime(worker_threads: Option<std::num::NonZeroUsize>) -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n.get());
    }
    builder
        .enable_all()
        .build()
        .expect("the tokio runtime starts")
}

/// Runs one command. `demo` is the demo binary's own (`src/bin/demo.rs`): the release binary
/// carries no fixture, so here it only says where the demo is.
pub fn run(command: Command) -> ExitCode {
    // One process-wide rustls provider, before anything can build a TLS config.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    match command {
        Command::Keygen { dir: None } => {
            print!("{}", commands::keygen::new_key_toml());
            ExitCode::SUCCESS
        }
        Command::Keygen { dir: Some(dir) } => match commands::keygen::write_key_file(&dir) {
            Ok(path) => {
                println!("{}", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("keygen: {e}");
                ExitCode::FAILURE
            }
        },
        Command::CheckConfig { config, print } => match commands::check_config::check(&config)
            .and_then(|report| {
                for w in &report.warnings {
                    eprintln!("{}: warning: {w}", config.display());
                }
                if print {
                    commands::check_config::print(&config)
                } else {
                    Ok(report.summary)
                }
            }) {
            Ok(out) => {
                println!("{out}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", config.display());
                ExitCode::from(EXIT_CONFIG as u8)
            }
        },
        Command::InspectState {
            config: path,
            show_answers,
            state,
        } => {
            let config = match Config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{}: {e}", path.display());
                    return ExitCode::from(EXIT_CONFIG as u8);
                }
            };
            let token = if state == "-" {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut s);
                s
            } else {
                state
            };
            match commands::inspect_state::inspect(&config, &token, show_answers) {
                Ok(report) => {
                    print!("{report}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(65)
                }
            }
        }
        Command::Serve { config: path } => {
            let config = match Config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{}: {e}", path.display());
                    return ExitCode::from(EXIT_CONFIG as u8);
                }
            };
            let runtime = runtime(config.runtime.worker_threads);
            // Trace export sends from the gateway's runtime; it is built before logging so
            // that the subscriber can be given its layer.
            let traces = match &config.tracing.otlp {
                Some(otlp) => {
                    match mrtr_gateway::telemetry::TraceExport::start(
                        otlp,
                        runtime.handle().clone(),
                    ) {
                        Ok(t) => Some(t),
                        Err(e) => {
                            eprintln!("{}: {e}", path.display());
                            return ExitCode::from(EXIT_CONFIG as u8);
                        }
                    }
                }
                None => None,
            };
            let mut logging =
                mrtr_gateway::telemetry::init(&config.log.level, config.log.format, traces);
            let outcome =
                runtime.block_on(commands::serve::run(config, path, logging.level.clone()));
            // The drain is over: the spans still queued go out (within tracing.export_timeout)
            // while the runtime they are sent from still runs.
            logging.flush_traces();
            drop(runtime);
            // Every line the writer still holds is written before the process says how it ended.
            drop(logging);
            match outcome {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mrtr-gateway: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Demo => {
            eprintln!(
                "the demo is not part of the release binary: run `cargo run --locked -- demo` in a source tree"
            );
            ExitCode::from(EXIT_CONFIG as u8)
        }
    }
}
