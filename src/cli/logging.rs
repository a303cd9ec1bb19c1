//! tracing-subscriber set-up: RUST_LOG filtering, text or JSON lines on stderr
//! so that stdout stays clean for reports and `--json` output.

use tracing_subscriber::EnvFilter;

use super::LogFormat;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests calling into the CLI twice) is harmless: ignore it.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
