//! `Recipient<M>`: an address typed by the message it accepts. The reply
//! address travels inside a request (through the codec, across a TCP link
//! between nodes) and the answer is converted into the asker's own message
//! type where the asker is hosted, in all three hosts.

use std::time::Duration;

use gyre_runtime::hosted::decoder_of;
use gyre_runtime::live::{LiveConfig, LiveNode};
use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{
    Actor, ActorId, Bincode, Codec, CodecError, Cx, NodeId, Recipient, message_key,
};
use serde::{Deserialize, Serialize};

/// A request whose reply field names no actor type.
#[derive(Debug, Serialize, Deserialize)]
struct Ask {
    n: u64,
    reply: Recipient<Answer>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Answer(u64);

/// Doubles: answers `Ask { n }` with `Answer(2n)` to whoever asked.
struct Server;

impl Actor for Server {
    type Msg = Ask;
    type Timer = ();
    fn on_msg(&mut self, _from: ActorId, ask: Ask, cx: &mut Cx<'_, Self>) {
        cx.send(ask.reply, Answer(2 * ask.n));
    }
}

/// The asker's own enum, which accepts the server's answers.
#[derive(Debug, Serialize, Deserialize)]
enum ClientMsg {
    Answer(Answer),
    Again(u64),
}

impl From<Answer> for ClientMsg {
    fn from(a: Answer) -> Self {
        ClientMsg::Answer(a)
    }
}

/// Asks the server for each of `asks` and reports every answer.
struct Client {
    server: Recipient<Ask>,
    report: Recipient<u64>,
    asks: Vec<u64>,
}

impl Actor for Client {
    type Msg = ClientMsg;
    type Timer = ();
    gyre_runtime::accepts!(Answer);

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        for &n in &self.asks {
            cx.send_self(ClientMsg::Again(n));
        }
    }

    fn on_msg(&mut self, _from: ActorId, msg: ClientMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            ClientMsg::Again(n) => {
                let reply = Recipient::of(cx.me());
                cx.send(self.server, Ask { n, reply });
            }
            ClientMsg::Answer(Answer(v)) => cx.send(self.report, v),
        }
    }
}

#[test]
fn a_recipient_round_trips_the_codec() {
    let mut sim = Sim::new(SimConfig::new(1));
    let server = Recipient::of(sim.probe::<Ask>(NodeId(0)));
    let report = Recipient::of(sim.probe::<u64>(NodeId(0)));
    let client = sim.spawn(
        NodeId(3),
        Client {
            server,
            report,
            asks: vec![],
        },
    );
    let r: Recipient<Answer> = Recipient::of(client);
    let bytes = Bincode::encode(&r).unwrap();
    let back: Recipient<Answer> = Bincode::decode(&bytes).unwrap();
    assert_eq!(back, r);
    assert_eq!(back.id(), client.id());
    let direct: Recipient<ClientMsg> = client.into();
    assert_ne!(
        Bincode::encode(&direct).unwrap(),
        bytes,
        "a recipient of the actor's own type is sent plain, and says so"
    );
}

#[test]
fn the_receiver_decodes_only_what_it_accepts() {
    let bytes = Bincode::encode(&Answer(4)).unwrap();
    let msg = decoder_of::<Client>()(Some(message_key::<Answer>()), &bytes).unwrap();
    assert_eq!(format!("{msg:?}"), "Answer(4)");
    assert_eq!(msg.tag(), Some(message_key::<Answer>()));
    let refused = decoder_of::<Server>()(Some(message_key::<Answer>()), &bytes);
    assert!(
        matches!(refused, Err(CodecError::NotAccepted { .. })),
        "{refused:?}"
    );
    assert_ne!(message_key::<Answer>(), message_key::<Ask>());
}

#[test]
fn sim_replies_through_recipients_across_nodes_and_the_codec() {
    for roundtrip in [false, true] {
        let mut cfg = SimConfig::new(5);
        cfg.codec_roundtrip = roundtrip;
        cfg.codec_compare_debug = roundtrip;
        let mut sim = Sim::new(cfg);
        let server = sim.spawn(NodeId(2), Server);
        let report = sim.probe::<u64>(NodeId(1));
        sim.spawn(
            NodeId(1),
            Client {
                server: server.into(),
                report: report.into(),
                asks: vec![1, 2, 3],
            },
        );
        sim.run().unwrap();
        let mut got: Vec<u64> = sim.take_probe(report).into_iter().map(|r| r.msg).collect();
        got.sort_unstable();
        assert_eq!(got, [2, 4, 6], "roundtrip {roundtrip}");
        assert_eq!(sim.stats().mistyped, 0);
    }
}

fn config(node: NodeId) -> LiveConfig {
    let mut cfg = LiveConfig::local(node, 2);
    cfg.listen = Some("127.0.0.1:0".parse().unwrap());
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_replies_cross_a_tcp_link_and_convert_at_the_asker() {
    let b = LiveNode::start(config(NodeId(2))).await.unwrap();
    let server = b.spawn(Server);
    let mut a_cfg = config(NodeId(1));
    a_cfg.peers.push((NodeId(2), b.local_addr().unwrap()));
    let a = LiveNode::start(a_cfg).await.unwrap();
    assert!(a.connected(NodeId(2), Duration::from_secs(5)).await);
    let (report, mut rx) = a.probe::<u64>(8);
    a.spawn(Client {
        server: server.into(),
        report: report.into(),
        asks: vec![10, 20],
    });
    let mut got = Vec::new();
    for _ in 0..2 {
        let (_, v) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("timed out")
            .expect("closed");
        got.push(v);
    }
    got.sort_unstable();
    assert_eq!(got, [20, 40]);
    // The asks went out as plain frames, the answers came back as tells;
    // nothing was refused on either side.
    assert!(a.stats().frames_in >= 2, "{:?}", a.stats());
    assert_eq!(a.stats().dropped_invalid + b.stats().dropped_invalid, 0);
    assert_eq!(a.stats().decode_errors + b.stats().decode_errors, 0);
    a.shutdown().await;
    b.shutdown().await;
}

#[cfg(feature = "actix")]
#[test]
fn actix_replies_through_recipients_and_reach_a_users_actor() {
    use std::sync::{Arc, Mutex};

    use actix::{Actor as ActixActor, Context, Handler, System};
    use gyre_runtime::actix_host::{ActixGyre, Tell};

    struct Collector(Arc<Mutex<Vec<u64>>>);
    impl ActixActor for Collector {
        type Context = Context<Self>;
    }
    impl Handler<Tell<u64>> for Collector {
        type Result = ();
        fn handle(&mut self, tell: Tell<u64>, _: &mut Context<Self>) {
            let mut seen = self.0.lock().unwrap();
            seen.push(tell.msg);
            if seen.len() == 2 {
                System::current().stop();
            }
        }
    }

    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    let sys = System::new();
    sys.block_on(async move {
        let gyre = ActixGyre::new(NodeId(0), 3);
        let report = gyre.external(Collector(seen2).start().recipient());
        let server = gyre.start(Server);
        gyre.start(Client {
            server: server.id.into(),
            report: report.into(),
            asks: vec![5, 6],
        });
    });
    sys.run().unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, [10, 12]);
}

/// Converts from `Answer` but forgot to list it in `accepts!`.
struct Forgetful;

#[derive(Debug, Serialize, Deserialize)]
struct ForgetfulMsg(Answer);

impl From<Answer> for ForgetfulMsg {
    fn from(a: Answer) -> Self {
        ForgetfulMsg(a)
    }
}

impl Actor for Forgetful {
    type Msg = ForgetfulMsg;
    type Timer = ();
    fn on_msg(&mut self, _: ActorId, _: ForgetfulMsg, _: &mut Cx<'_, Self>) {}
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "accepts! table does not list it")]
fn a_recipient_the_receiver_does_not_list_is_caught_in_debug_builds() {
    let mut sim = Sim::new(SimConfig::new(1));
    let f = sim.spawn(NodeId(0), Forgetful);
    let _: Recipient<Answer> = Recipient::of(f);
}
