//! The actix adapter hosts Gyre actors next to a user's own actix actors:
//! messages flow both ways, timers and I/O work, spawn and stop work.
#![cfg(feature = "actix")]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use actix::{Actor as ActixActor, Context, Handler, System};
use gyre_runtime::actix_host::{ActixGyre, Envelope, GyreHandle, Tell};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, IoError, IoRequest, MILLIS, NodeId};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum EchoMsg {
    /// Reply `n * 2` to `to` after `delay_ms`, computed through an I/O request.
    Double {
        n: u64,
        delay_ms: u64,
        to: Addr<External<Out>>,
    },
    Computed {
        n: u64,
        to: Addr<External<Out>>,
        result: Result<u64, IoError>,
    },
    Quit,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Out {
    Doubled(u64),
    Started(ActorId),
    Failed(String),
    Counted(u64),
}

struct Doubling(u64);
impl IoRequest for Doubling {
    type Output = u64;
    fn kind(&self) -> &'static str {
        "double"
    }
    fn run(self) -> Result<u64, IoError> {
        self.0
            .checked_mul(2)
            .ok_or_else(|| IoError::Failed("overflow".into()))
    }
}

#[derive(Default)]
struct Echo {
    pending: Vec<(u64, Addr<External<Out>>)>,
}

impl Actor for Echo {
    type Msg = EchoMsg;
    type Timer = u64;

    fn on_msg(&mut self, _from: ActorId, msg: EchoMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            EchoMsg::Double { n, delay_ms, to } => {
                let key = self.pending.len() as u64;
                self.pending.push((n, to));
                cx.set_timer(key, delay_ms * MILLIS);
            }
            EchoMsg::Computed { to, result, n } => match result {
                Ok(v) => cx.send(to, Out::Doubled(v)),
                Err(e) => cx.send(to, Out::Failed(format!("{n}: {e}"))),
            },
            EchoMsg::Quit => cx.stop(),
        }
    }

    fn on_timer(&mut self, key: u64, cx: &mut Cx<'_, Self>) {
        let (n, to) = self.pending[key as usize];
        cx.io(Doubling(n), move |result| EchoMsg::Computed {
            n,
            to,
            result,
        });
    }
}

/// Spawns an `Echo` child on start and announces it.
struct Parent {
    report: Addr<External<Out>>,
}
impl Actor for Parent {
    type Msg = ();
    type Timer = ();
    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        let child = cx.spawn(Echo::default());
        cx.send(self.report, Out::Started(child.id()));
        cx.send(
            child,
            EchoMsg::Double {
                n: 21,
                delay_ms: 1,
                to: self.report,
            },
        );
    }
    fn on_msg(&mut self, _: ActorId, _: (), _: &mut Cx<'_, Self>) {}
}

/// A user's ordinary actix actor that collects what Gyre actors send it.
struct Collector {
    seen: Arc<Mutex<Vec<Out>>>,
    stop_after: usize,
}
impl ActixActor for Collector {
    type Context = Context<Self>;
}
impl Handler<Tell<Out>> for Collector {
    type Result = ();
    fn handle(&mut self, tell: Tell<Out>, _: &mut Context<Self>) {
        let mut seen = self.seen.lock().unwrap();
        seen.push(tell.msg);
        if seen.len() == self.stop_after {
            System::current().stop();
        }
    }
}

#[test]
fn gyre_and_actix_actors_talk_both_ways() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    let sys = System::new();
    sys.block_on(async move {
        let gyre = ActixGyre::new(NodeId(0), 7);
        let collector = Collector {
            seen: seen2,
            stop_after: 5,
        }
        .start();
        let out = gyre.external(collector.recipient());
        let echo = gyre.start(Echo::default());
        let user = ActorId::new(9, 9);
        // Later timer first: replies come back in timer order, not send order.
        echo.tell(
            user,
            EchoMsg::Double {
                n: 5,
                delay_ms: 40,
                to: out,
            },
        );
        echo.tell(
            user,
            EchoMsg::Double {
                n: 7,
                delay_ms: 1,
                to: out,
            },
        );
        echo.tell(
            user,
            EchoMsg::Double {
                n: u64::MAX,
                delay_ms: 5,
                to: out,
            },
        );
        gyre.start(Parent { report: out });
    });
    sys.run().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 5, "{seen:?}");
    // Ids: the external got 1, echo 2, parent 3, its child 4.
    assert!(seen.contains(&Out::Started(ActorId::new(0, 4))), "{seen:?}");
    let pos = |o: &Out| seen.iter().position(|s| s == o).unwrap();
    assert!(pos(&Out::Doubled(14)) < pos(&Out::Doubled(10)), "{seen:?}");
    assert!(seen.contains(&Out::Doubled(42)));
    assert!(
        seen.iter()
            .any(|o| matches!(o, Out::Failed(s) if s.contains("overflow")))
    );
}

#[test]
fn stopped_actor_no_longer_receives() {
    let sys = System::new();
    let dropped = sys.block_on(async move {
        let gyre = ActixGyre::new(NodeId(0), 1);
        let echo = gyre.start(Echo::default());
        echo.tell(ActorId::new(9, 9), EchoMsg::Quit);
        // Give the actor a few turns of the arbiter to stop.
        for _ in 0..50 {
            actix::clock::sleep(std::time::Duration::from_millis(2)).await;
            if !echo.addr.connected() {
                break;
            }
        }
        gyre.send(ActorId::new(9, 9), echo.id, EchoMsg::Quit);
        gyre.dropped()
    });
    assert_eq!(dropped, 1);
}

/// Stops the system after a generous while, so that a lost message fails
/// the test's assertions instead of hanging it.
fn stop_if_stuck() {
    actix::spawn(async {
        actix::clock::sleep(std::time::Duration::from_secs(60)).await;
        System::current().stop();
    });
}

/// Checks that each sender's numbered messages arrive in the order sent,
/// and reports the count once `expect` arrived.
struct InOrder {
    next: BTreeMap<ActorId, u64>,
    seen: u64,
    expect: u64,
    report: Addr<External<Out>>,
}
impl Actor for InOrder {
    type Msg = u64;
    type Timer = ();
    fn on_msg(&mut self, from: ActorId, n: u64, cx: &mut Cx<'_, Self>) {
        let next = self.next.entry(from).or_default();
        if n != *next {
            cx.send(
                self.report,
                Out::Failed(format!("{from}: {n} after {next}")),
            );
        }
        *next = n + 1;
        self.seen += 1;
        if self.seen == self.expect {
            cx.send(self.report, Out::Counted(self.seen));
        }
    }
}

/// Sends `count` numbered messages to `to` in one handler.
struct Burst {
    to: Addr<InOrder>,
    count: u64,
}
impl Actor for Burst {
    type Msg = ();
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, (): (), cx: &mut Cx<'_, Self>) {
        for n in 0..self.count {
            cx.send(self.to, n);
        }
    }
}

/// A node with an [`InOrder`] actor that reports its first finding to a
/// [`Collector`] filling `seen`, which then stops the system.
fn in_order_node(
    seed: u64,
    expect: u64,
    seen: Arc<Mutex<Vec<Out>>>,
) -> (ActixGyre, GyreHandle<InOrder>) {
    stop_if_stuck();
    let gyre = ActixGyre::new(NodeId(0), seed);
    let collector = Collector {
        seen,
        stop_after: 1,
    }
    .start();
    let report = gyre.external(collector.recipient());
    let in_order = gyre.start(InOrder {
        next: BTreeMap::new(),
        seen: 0,
        expect,
        report,
    });
    (gyre, in_order)
}

#[test]
fn each_senders_messages_arrive_in_order() {
    const COUNT: u64 = 500;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    let sys = System::new();
    sys.block_on(async move {
        let (gyre, in_order) = in_order_node(3, 3 * COUNT, seen2);
        for burst in 0..2 {
            let b = gyre.start(Burst {
                to: in_order.id,
                count: COUNT,
            });
            gyre.send(ActorId::new(9, burst), b.id, ());
        }
        // From outside, through the handle and through the node, mixed.
        let user = ActorId::new(9, 9);
        for n in 0..COUNT {
            if n % 2 == 0 {
                in_order.tell(user, n);
            } else {
                gyre.send(user, in_order.id, n);
            }
        }
    });
    sys.run().unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![Out::Counted(3 * 500)]);
}

#[test]
fn an_envelope_sent_to_the_actix_address_is_delivered() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    let sys = System::new();
    let dropped = sys.block_on(async move {
        let (gyre, in_order) = in_order_node(5, 1, seen2);
        let from = ActorId::new(9, 1);
        // A mistyped one is dropped with a warning and leaves the actor as is.
        in_order.addr.do_send(Envelope {
            from,
            msg: Box::new("not a number".to_string()),
        });
        in_order.addr.do_send(Envelope {
            from,
            msg: Box::new(0u64),
        });
        gyre.dropped()
    });
    sys.run().unwrap();
    assert_eq!(dropped, 0);
    assert_eq!(*seen.lock().unwrap(), vec![Out::Counted(1)]);
}
