//! "Network only to the gateway" for a bwrap sandbox. The sandbox gets a
//! network namespace of its own (`--unshare-net`: loopback only), so it
//! reaches no TCP address of the host at all; the one way out is a Unix
//! socket bound into it, since a path-named socket is reached through the
//! file system, which crosses network namespaces.
//!
//! - Outside, [`GatewayBridge`] listens on that socket (one per execution,
//!   in the execution's folder) and carries each connection to the
//!   gateway's TCP address, and nowhere else.
//! - Inside, the sandbox's first process is `gyre sandbox-forward`
//!   ([`serve_in_sandbox`]): it listens on `127.0.0.1:PORT` of the
//!   namespace's loopback, relays each connection over the socket, runs
//!   the harness command with `OPENAI_BASE_URL` and friends pointing at
//!   that port, and exits with the harness's status.

use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use tokio::task::JoinHandle;

/// The gateway's address in a base URL such as `http://127.0.0.1:8080`.
pub fn gateway_addr(api_base: &str) -> io::Result<SocketAddr> {
    let rest = api_base.strip_prefix("http://").ok_or_else(|| {
        bad(format!(
            "the gateway's URL {api_base} is not http://HOST:PORT"
        ))
    })?;
    let host_port = rest.split('/').next().unwrap_or(rest);
    host_port.to_socket_addrs()?.next().ok_or_else(|| {
        bad(format!(
            "the gateway's address {host_port} resolves to nothing"
        ))
    })
}

fn bad(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// The host side: a Unix socket whose every connection goes to the
/// gateway. Dropping it stops listening and removes the socket file.
pub struct GatewayBridge {
    path: PathBuf,
    task: JoinHandle<()>,
}

impl GatewayBridge {
    /// Listens on `path` (replacing a stale socket there) and relays to
    /// `gateway`.
    pub fn start(path: &Path, gateway: SocketAddr) -> io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)?;
        let task = tokio::spawn(async move {
            while let Ok((mut inside, _)) = listener.accept().await {
                tokio::spawn(async move {
                    match tokio::net::TcpStream::connect(gateway).await {
                        Ok(mut out) => {
                            let _ = tokio::io::copy_bidirectional(&mut inside, &mut out).await;
                        }
                        Err(error) => {
                            tracing::warn!(%error, %gateway, "sandbox bridge: the gateway is unreachable")
                        }
                    }
                });
            }
        });
        Ok(Self {
            path: path.to_path_buf(),
            task,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for GatewayBridge {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The argv that starts `argv` behind the in-sandbox forwarder: `forwarder`
/// is a `gyre` binary, `listen` the loopback address the harness is told,
/// `socket` the bridge's path (bound into the sandbox).
pub fn forwarded_argv(
    forwarder: &Path,
    listen: SocketAddr,
    socket: &Path,
    argv: Vec<String>,
) -> Vec<String> {
    let mut a = vec![
        forwarder.to_string_lossy().into_owned(),
        "sandbox-forward".into(),
        "--listen".into(),
        listen.to_string(),
        "--unix".into(),
        socket.to_string_lossy().into_owned(),
        "--".into(),
    ];
    a.extend(argv);
    a
}

/// The sandbox side (`gyre sandbox-forward`): relays `listen` to `socket`
/// while `argv` runs; returns the exit code to exit with (the harness's
/// code, 128 + its signal, or 127 when it cannot start).
pub fn serve_in_sandbox(listen: SocketAddr, socket: &Path, argv: &[String]) -> io::Result<i32> {
    let Some((program, args)) = argv.split_first() else {
        return Err(bad("sandbox-forward: no command to run".into()));
    };
    let listener = TcpListener::bind(listen)?;
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(tcp) = conn else { continue };
            let socket = socket.clone();
            std::thread::spawn(move || relay(tcp, &socket));
        }
    });
    match Command::new(program).args(args).status() {
        Ok(status) => Ok(exit_code(status)),
        Err(e) => {
            eprintln!("gyre sandbox-forward: cannot start {program}: {e}");
            Ok(127)
        }
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Copies one connection both ways until either side closes.
fn relay(tcp: std::net::TcpStream, socket: &Path) {
    let unix = match UnixStream::connect(socket) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("gyre sandbox-forward: the gateway's socket: {e}");
            return;
        }
    };
    let (Ok(mut tcp_r), Ok(mut unix_w)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let (mut unix_r, mut tcp_w) = (unix, tcp);
    let up = std::thread::spawn(move || {
        let _ = io::copy(&mut tcp_r, &mut unix_w);
        let _ = unix_w.shutdown(std::net::Shutdown::Write);
    });
    let _ = io::copy(&mut unix_r, &mut tcp_w);
    let _ = tcp_w.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn gateway_urls_parse_to_addresses() {
        assert_eq!(
            gateway_addr("http://127.0.0.1:8080").unwrap(),
            "127.0.0.1:8080".parse().unwrap()
        );
        assert_eq!(gateway_addr("http://127.0.0.1:9/v1").unwrap().port(), 9);
        assert!(gateway_addr("https://x:1").is_err());
        assert!(gateway_addr("http://nohost").is_err());
    }

    #[test]
    fn the_bridge_carries_a_connection_to_the_gateway_and_back() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf.map(|b| b.to_ascii_uppercase())).unwrap();
        });
        let dir = std::env::temp_dir().join(format!("gyre-fwd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("gw.sock");
        let bridge = rt
            .block_on(async { GatewayBridge::start(&sock, addr) })
            .unwrap();
        // The in-sandbox relay, run here on a loopback port of its own.
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let front_addr = front.local_addr().unwrap();
        let s2 = sock.clone();
        std::thread::spawn(move || {
            let (tcp, _) = front.accept().unwrap();
            relay(tcp, &s2);
        });
        let got = rt.block_on(async move {
            tokio::task::spawn_blocking(move || {
                let mut c = std::net::TcpStream::connect(front_addr).unwrap();
                c.write_all(b"hello").unwrap();
                let mut out = [0u8; 5];
                c.read_exact(&mut out).unwrap();
                out
            })
            .await
            .unwrap()
        });
        assert_eq!(&got, b"HELLO");
        drop(bridge);
        assert!(!sock.exists(), "the socket file goes with the bridge");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
