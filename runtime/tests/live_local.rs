//! The live host inside one process: request/reply, timers, spawn, stop,
//! I/O completions, mailbox backpressure and shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gyre_runtime::live::{LiveConfig, LiveNode};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, IoError, IoRequest, MILLIS, Nanos, NodeId};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::Receiver;

const WAIT: Duration = Duration::from_secs(5);

async fn recv<T>(rx: &mut Receiver<T>) -> T {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("timed out waiting for a message")
        .expect("probe closed")
}

async fn node() -> LiveNode {
    LiveNode::start(LiveConfig::local(NodeId(1), 42))
        .await
        .unwrap()
}

// ---------- request / reply, spawn, stop ----------

#[derive(Debug, Serialize, Deserialize)]
enum EchoMsg {
    Ping {
        n: u64,
        reply_to: Addr<External<Reply>>,
    },
    Stop,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum Reply {
    Pong { n: u64, by: ActorId },
    Spawned(Addr<Echo>),
}

struct Echo;

impl Actor for Echo {
    type Msg = EchoMsg;
    type Timer = ();
    fn on_msg(&mut self, _from: ActorId, msg: EchoMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            EchoMsg::Ping { n, reply_to } => cx.send(reply_to, Reply::Pong { n, by: cx.id() }),
            EchoMsg::Stop => cx.stop(),
        }
    }
}

/// Spawns an [`Echo`] on request and reports its address.
struct Parent;

impl Actor for Parent {
    type Msg = Addr<External<Reply>>;
    type Timer = ();
    fn on_msg(&mut self, _from: ActorId, reply_to: Self::Msg, cx: &mut Cx<'_, Self>) {
        let child = cx.spawn(Echo);
        // The child is reachable from the very next effect.
        cx.send(child, EchoMsg::Ping { n: 0, reply_to });
        cx.send(reply_to, Reply::Spawned(child));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_reply_spawn_and_stop() {
    let node = node().await;
    let parent = node.spawn(Parent);
    let (probe, mut rx) = node.probe::<Reply>(16);
    assert_eq!(parent.id(), ActorId::new(1, 1), "ids start at 1");
    assert_eq!(probe.id(), ActorId::new(1, 2));

    node.send(probe.id(), parent, probe).await.unwrap();
    let (_, first) = recv(&mut rx).await;
    let (_, second) = recv(&mut rx).await;
    let child = match (&first, &second) {
        (Reply::Spawned(c), Reply::Pong { n: 0, by })
        | (Reply::Pong { n: 0, by }, Reply::Spawned(c)) => {
            assert_eq!(c.id(), *by);
            *c
        }
        other => panic!("unexpected replies {other:?}"),
    };
    assert_eq!(
        child.id(),
        ActorId::new(1, 3),
        "the child takes the next id"
    );

    for n in 1..=100 {
        node.send(probe.id(), child, EchoMsg::Ping { n, reply_to: probe })
            .await
            .unwrap();
    }
    for n in 1..=100 {
        let (from, reply) = recv(&mut rx).await;
        assert_eq!(from, child.id());
        assert_eq!(reply, Reply::Pong { n, by: child.id() });
    }

    node.send(probe.id(), child, EchoMsg::Stop).await.unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        match node
            .send(
                probe.id(),
                child,
                EchoMsg::Ping {
                    n: 999,
                    reply_to: probe,
                },
            )
            .await
        {
            Err(gyre_runtime::RuntimeError::NoSuchActor(id)) => {
                assert_eq!(id, child.id());
                break;
            }
            Ok(()) => assert!(Instant::now() < deadline, "stopped actor still accepts"),
            Err(e) => panic!("unexpected {e}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A ping accepted into the mailbox before the stop took effect is
    // dropped, never answered.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), rx.recv())
            .await
            .is_err()
    );
    node.shutdown().await;
}

// ---------- timers ----------

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Tick {
    Once,
    Rearmed,
    Cancelled,
    Periodic,
}

struct Timed {
    report: Addr<External<(String, Nanos)>>,
    periodic: u32,
}

impl Actor for Timed {
    type Msg = ();
    type Timer = Tick;

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.set_timer(Tick::Once, 40 * MILLIS);
        cx.set_timer(Tick::Rearmed, 20 * MILLIS);
        cx.set_timer(Tick::Rearmed, 80 * MILLIS); // replaces the 20 ms one
        cx.set_timer(Tick::Cancelled, 10 * MILLIS);
        cx.cancel_timer(&Tick::Cancelled);
        cx.set_timer(Tick::Periodic, 15 * MILLIS);
        assert!(!cx.timer_armed(&Tick::Cancelled));
    }

    fn on_msg(&mut self, _from: ActorId, _msg: (), _cx: &mut Cx<'_, Self>) {}

    fn on_timer(&mut self, timer: Tick, cx: &mut Cx<'_, Self>) {
        cx.send(self.report, (format!("{timer:?}"), cx.now()));
        if timer == Tick::Periodic {
            self.periodic += 1;
            if self.periodic < 3 {
                cx.set_timer(Tick::Periodic, 15 * MILLIS);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_fire_rearm_and_cancel() {
    let node = node().await;
    let (report, mut rx) = node.probe::<(String, Nanos)>(16);
    node.spawn(Timed {
        report,
        periodic: 0,
    });
    let mut fired = Vec::new();
    for _ in 0..5 {
        let (_, (name, at)) = recv(&mut rx).await;
        fired.push((name, at));
    }
    // Nothing else: no stale 20 ms Rearmed, no Cancelled, no 4th Periodic.
    assert!(
        tokio::time::timeout(Duration::from_millis(150), rx.recv())
            .await
            .is_err()
    );
    let names: Vec<&str> = fired.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names.iter().filter(|n| **n == "Periodic").count(),
        3,
        "{names:?}"
    );
    assert_eq!(
        names.iter().filter(|n| **n == "Once").count(),
        1,
        "{names:?}"
    );
    assert_eq!(
        names.iter().filter(|n| **n == "Rearmed").count(),
        1,
        "{names:?}"
    );
    let at = |name: &str| fired.iter().find(|(n, _)| n == name).unwrap().1;
    assert!(at("Once") >= 40 * MILLIS);
    assert!(at("Rearmed") >= 80 * MILLIS, "the re-armed deadline wins");
    let periodic: Vec<Nanos> = fired
        .iter()
        .filter(|(n, _)| n == "Periodic")
        .map(|(_, t)| *t)
        .collect();
    assert!(
        periodic.windows(2).all(|w| w[1] >= w[0] + 15 * MILLIS),
        "{periodic:?}"
    );
    node.shutdown().await;
}

// ---------- I/O completions ----------

struct Double(u64);

impl IoRequest for Double {
    type Output = (u64, String);
    fn kind(&self) -> &'static str {
        "double"
    }
    fn run(self) -> Result<(u64, String), IoError> {
        let thread = thread_name();
        match self.0 {
            0 => Err(IoError::Failed("zero is not allowed".into())),
            x => Ok((x * 2, thread)),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum IoMsg {
    Go(u64),
    Done(Result<(u64, String), IoError>),
}

/// The issuing thread and the request's result.
type IoReport = (String, Result<(u64, String), IoError>);

struct Worker {
    report: Addr<External<IoReport>>,
    /// The thread the handler that issued the request ran on.
    issued_on: String,
}

fn thread_name() -> String {
    let t = std::thread::current();
    format!("{:?}/{}", t.id(), t.name().unwrap_or("?"))
}

impl Actor for Worker {
    type Msg = IoMsg;
    type Timer = ();
    fn on_msg(&mut self, _from: ActorId, msg: IoMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            IoMsg::Go(x) => {
                self.issued_on = thread_name();
                cx.io(Double(x), IoMsg::Done);
            }
            IoMsg::Done(r) => cx.send(self.report, (self.issued_on.clone(), r)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_completions_come_back_as_messages() {
    let node = node().await;
    let (report, mut rx) = node.probe(4);
    let worker = node.spawn(Worker {
        report,
        issued_on: String::new(),
    });
    node.send(report.id(), worker, IoMsg::Go(21)).await.unwrap();
    let (from, (actor_thread, ok)) = recv(&mut rx).await;
    assert_eq!(from, worker.id());
    let (value, io_thread) = ok.unwrap();
    assert_eq!(value, 42);
    assert_ne!(io_thread, actor_thread, "I/O ran on the actor's own thread");
    node.send(report.id(), worker, IoMsg::Go(0)).await.unwrap();
    let (_, (_, failed)) = recv(&mut rx).await;
    assert_eq!(failed, Err(IoError::Failed("zero is not allowed".into())));
    node.shutdown().await;
}

// ---------- backpressure ----------

/// Handles one message per `delay`, recording how far ahead of it the
/// sender had got.
struct Slow {
    delay: Duration,
    /// Set by an outside sender before each attempt.
    attempted: Option<Arc<AtomicU64>>,
    next: u64,
    max_ahead: u64,
    report: Addr<External<(u64, u64)>>,
    total: u64,
}

impl Actor for Slow {
    type Msg = u64;
    type Timer = ();
    fn on_msg(&mut self, _from: ActorId, seq: u64, cx: &mut Cx<'_, Self>) {
        assert_eq!(seq, self.next, "lost or reordered");
        self.next += 1;
        // Messages the sender had started to send, minus those consumed:
        // at most the mailbox plus the one the sender is waiting to push.
        if let Some(attempted) = &self.attempted {
            let ahead = attempted.load(Ordering::SeqCst) - self.next;
            self.max_ahead = self.max_ahead.max(ahead);
        }
        std::thread::sleep(self.delay); // a slow handler, on purpose
        if self.next == self.total {
            cx.send(self.report, (self.next, self.max_ahead));
        }
    }
}

/// Sends `total` numbers to `to` from inside one handler.
struct Burst {
    to: Addr<Slow>,
    total: u64,
    done: Addr<External<(u64, u64)>>,
}

impl Actor for Burst {
    type Msg = ();
    type Timer = ();
    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        for seq in 0..self.total {
            cx.send(self.to, seq);
        }
        // Applied only after every send above found room.
        cx.send(self.done, (self.total, 0));
    }
    fn on_msg(&mut self, _from: ActorId, _msg: (), _cx: &mut Cx<'_, Self>) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_slows_its_sender_and_loses_nothing() {
    const CAP: usize = 8;
    const TOTAL: u64 = 120;
    let delay = Duration::from_millis(2);
    let mut cfg = LiveConfig::local(NodeId(1), 1);
    cfg.mailbox_capacity = CAP;
    let node = LiveNode::start(cfg).await.unwrap();
    let (report, mut rx) = node.probe(4);

    // An outside sender: counts each attempt before making it.
    let attempted = Arc::new(AtomicU64::new(0));
    let slow = node.spawn(Slow {
        delay,
        attempted: Some(Arc::clone(&attempted)),
        next: 0,
        max_ahead: 0,
        report,
        total: TOTAL,
    });
    let t0 = Instant::now();
    for seq in 0..TOTAL {
        attempted.fetch_add(1, Ordering::SeqCst);
        node.send(report.id(), slow, seq).await.unwrap();
    }
    let sending = t0.elapsed();
    let (_, (got, max_ahead)) = recv(&mut rx).await;
    assert_eq!(got, TOTAL, "nothing lost");
    assert!(
        max_ahead <= CAP as u64 + 1,
        "sender got {max_ahead} ahead of a mailbox of {CAP}"
    );
    assert!(
        max_ahead >= CAP as u64 - 1,
        "the mailbox never filled ({max_ahead}): no backpressure shown"
    );
    let floor = delay * (TOTAL as u32 - CAP as u32 - 1);
    assert!(
        sending >= floor,
        "sender finished in {sending:?}, faster than the consumer allows ({floor:?})"
    );

    // An actor sender: its later effect waits for every earlier send.
    let slow2 = node.spawn(Slow {
        delay,
        attempted: None,
        next: 0,
        max_ahead: 0,
        report,
        total: TOTAL,
    });
    let t1 = Instant::now();
    node.spawn(Burst {
        to: slow2,
        total: TOTAL,
        done: report,
    });
    let mut order = Vec::new();
    for _ in 0..2 {
        let (from, _) = recv(&mut rx).await;
        order.push((from, t1.elapsed()));
    }
    let burst_done = order.iter().find(|(f, _)| *f != slow2.id()).unwrap().1;
    assert!(
        burst_done >= floor,
        "burst sender was not slowed: {burst_done:?} < {floor:?}"
    );
    assert!(
        order.iter().any(|(f, _)| *f == slow2.id()),
        "consumer got all {TOTAL}"
    );
    node.shutdown().await;
}

// ---------- shutdown ----------

struct Ticker {
    _alive: Arc<()>,
}

impl Actor for Ticker {
    type Msg = ();
    type Timer = ();
    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.set_timer((), MILLIS);
    }
    fn on_msg(&mut self, _from: ActorId, _msg: (), _cx: &mut Cx<'_, Self>) {}
    fn on_timer(&mut self, _t: (), cx: &mut Cx<'_, Self>) {
        cx.set_timer((), MILLIS);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_prompt_and_drops_every_actor() {
    let node = node().await;
    let alive = Arc::new(());
    for _ in 0..50 {
        node.spawn(Ticker {
            _alive: Arc::clone(&alive),
        });
    }
    let (probe, mut rx) = node.probe::<u64>(4);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(Arc::strong_count(&alive), 51);
    let handle = node.clone();
    let t0 = Instant::now();
    node.shutdown().await;
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "shutdown took {:?}",
        t0.elapsed()
    );
    assert_eq!(
        Arc::strong_count(&alive),
        1,
        "every actor task ended and dropped its actor"
    );
    assert!(rx.recv().await.is_none(), "probes are closed");
    assert!(matches!(
        handle.send(probe.id(), probe, 1u64).await,
        Err(gyre_runtime::RuntimeError::ShutDown)
    ));
    handle.spawn(Ticker {
        _alive: Arc::clone(&alive),
    });
    assert_eq!(
        Arc::strong_count(&alive),
        1,
        "nothing starts after shutdown"
    );
}

// ---------- executors ----------

/// Relays a counter around a ring of actors until it reaches `laps` laps.
struct Ring {
    next: Option<Addr<Ring>>,
    done: Addr<External<u64>>,
    limit: u64,
}

#[derive(Debug, Serialize, Deserialize)]
enum RingMsg {
    Link(Addr<Ring>),
    Token(u64),
}

impl Actor for Ring {
    type Msg = RingMsg;
    type Timer = ();
    fn on_msg(&mut self, _from: ActorId, msg: RingMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            RingMsg::Link(next) => self.next = Some(next),
            RingMsg::Token(n) if n >= self.limit => cx.send(self.done, n),
            RingMsg::Token(n) => {
                if let Some(next) = self.next {
                    cx.send(next, RingMsg::Token(n + 1));
                }
            }
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_executor_kind_runs_actors_and_timers() {
    for threads in [0usize, 1, 3] {
        let mut cfg = LiveConfig::local(NodeId(1), 9);
        cfg.actor_threads = threads;
        let node = LiveNode::start(cfg).await.unwrap();
        let (done, mut rx) = node.probe::<u64>(4);
        let ring: Vec<Addr<Ring>> = (0..7)
            .map(|_| {
                node.spawn(Ring {
                    next: None,
                    done,
                    limit: 10_000,
                })
            })
            .collect();
        for (i, a) in ring.iter().enumerate() {
            node.send(done.id(), *a, RingMsg::Link(ring[(i + 1) % ring.len()]))
                .await
                .unwrap();
        }
        node.send(done.id(), ring[0], RingMsg::Token(0))
            .await
            .unwrap();
        assert_eq!(recv(&mut rx).await.1, 10_000, "threads={threads}");

        let (report, mut ticks) = node.probe::<(String, Nanos)>(16);
        node.spawn(Timed {
            report,
            periodic: 0,
        });
        for _ in 0..5 {
            recv(&mut ticks).await;
        }
        node.shutdown().await;
    }
}
