//! tracing-subscriber set-up: RUST_LOG filtering, text or JSON lines on stderr
//! so that stdout stays clean for reports and `--json` output.

use tracing_subscriber::EnvFilter;

use super::LogFormat;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // A log line that cannot be written is dropped: by default the
    // subscriber reports the failure with `eprintln!`, which panics when
    // stderr is a broken pipe (a node agent whose head, which read its
    // log, was killed), in whatever task was logging.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    // A second init (tests calling into the CLI twice) is harmless: ignore it.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
