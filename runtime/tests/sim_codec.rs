//! The optional codec round-trip: a message that cannot be encoded or
//! decoded, or that changes across the wire, fails the run naming its type;
//! a message of the wrong type is dropped and counted, never a panic.

use gyre_runtime::sim::{Sim, SimConfig, SimFailure};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, NodeId};
use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Encodes fine only when `ok`.
#[derive(Debug, Deserialize)]
struct Fragile {
    ok: bool,
}

impl Serialize for Fragile {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.ok {
            s.serialize_bool(true)
        } else {
            Err(S::Error::custom("fragile value refuses to encode"))
        }
    }
}

/// Encodes, but never decodes.
#[derive(Debug, Serialize)]
struct OneWay(u32);

impl<'de> Deserialize<'de> for OneWay {
    fn deserialize<D: Deserializer<'de>>(_d: D) -> Result<Self, D::Error> {
        Err(D::Error::custom("one-way value cannot be decoded"))
    }
}

/// Loses a field on the wire.
#[derive(Debug, Serialize, Deserialize)]
struct Lossy {
    kept: u32,
    #[serde(skip)]
    dropped: u32,
}

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Plain(u32),
    Fragile(Fragile),
    OneWay(OneWay),
    Lossy(Lossy),
}

#[derive(Default)]
struct Sink {
    got: Vec<String>,
    /// What arrived in `Lossy::dropped`.
    dropped: Vec<u32>,
}

impl Actor for Sink {
    type Msg = Msg;
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, msg: Msg, _cx: &mut Cx<'_, Self>) {
        if let Msg::Lossy(l) = &msg {
            self.dropped.push(l.dropped);
        }
        self.got.push(format!("{msg:?}"));
    }
}

fn world(roundtrip: bool, compare: bool) -> (Sim, Addr<Sink>) {
    let mut cfg = SimConfig::new(9);
    cfg.codec_roundtrip = roundtrip;
    cfg.codec_compare_debug = compare;
    let mut sim = Sim::new(cfg);
    let sink = sim.spawn(NodeId(1), Sink::default());
    (sim, sink)
}

const FROM: ActorId = ActorId::new(0, 1);

#[test]
fn well_formed_messages_pass_the_round_trip() {
    let (mut sim, sink) = world(true, true);
    sim.inject(FROM, sink, Msg::Plain(7));
    sim.inject(FROM, sink, Msg::Fragile(Fragile { ok: true }));
    sim.run().unwrap();
    assert_eq!(
        sim.actor(sink).unwrap().got,
        ["Plain(7)", "Fragile(Fragile { ok: true })"]
    );
}

#[test]
fn a_message_that_cannot_encode_fails_the_run() {
    let (mut sim, sink) = world(true, false);
    sim.inject(FROM, sink, Msg::Fragile(Fragile { ok: false }));
    let err = sim.run().unwrap_err();
    match &err.failure {
        SimFailure::Codec { ty, to, .. } => {
            assert!(ty.ends_with("Msg"), "{ty}");
            assert_eq!(*to, sink.id());
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("refuses to encode"), "{err}");

    // Without the check, the same message is delivered in memory.
    let (mut sim, sink) = sim_plain();
    sim.inject(FROM, sink, Msg::Fragile(Fragile { ok: false }));
    sim.run().unwrap();
    assert_eq!(sim.actor(sink).unwrap().got.len(), 1);
}

fn sim_plain() -> (Sim, Addr<Sink>) {
    world(false, false)
}

#[test]
fn a_message_that_cannot_decode_fails_the_run() {
    let (mut sim, sink) = world(true, false);
    sim.inject(FROM, sink, Msg::OneWay(OneWay(3)));
    let err = sim.run().unwrap_err();
    assert!(matches!(err.failure, SimFailure::Codec { .. }), "{err}");
    assert!(err.to_string().contains("cannot be decoded"), "{err}");
    assert!(sim.actor(sink).unwrap().got.is_empty());
}

#[test]
fn a_field_lost_on_the_wire_is_caught_by_comparison() {
    let lossy = || {
        Msg::Lossy(Lossy {
            kept: 1,
            dropped: 2,
        })
    };
    let (mut sim, sink) = world(true, true);
    sim.inject(FROM, sink, lossy());
    let err = sim.run().unwrap_err();
    match &err.failure {
        SimFailure::Changed { sent, received, .. } => {
            assert!(sent.contains("dropped: 2"), "{sent}");
            assert!(received.contains("dropped: 0"), "{received}");
        }
        other => panic!("unexpected {other:?}"),
    }

    // Round-trip without comparison delivers the decoded (changed) value,
    // as the wire would.
    let (mut sim, sink) = world(true, false);
    sim.inject(FROM, sink, lossy());
    sim.run().unwrap();
    assert_eq!(
        sim.actor(sink).unwrap().got,
        ["Lossy(Lossy { kept: 1, dropped: 0 })"]
    );
    assert_eq!(sim.actor(sink).unwrap().dropped, [0]);
}

/// An actor of another message type, to mistype an address with.
struct Other;

impl Actor for Other {
    type Msg = String;
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, _msg: String, _cx: &mut Cx<'_, Self>) {}
}

#[test]
fn a_mistyped_message_is_counted_and_dropped() {
    let (mut sim, sink) = sim_plain();
    let probe = sim.probe::<u64>(NodeId(0));
    // Claims that the sink and the probe take strings: they do not.
    sim.inject(FROM, Addr::<Other>::new(sink.id()), "hello".to_owned());
    sim.inject(
        FROM,
        Addr::<External<String>>::new(probe.id()),
        "hi".to_owned(),
    );
    sim.inject(FROM, sink, Msg::Plain(1));
    sim.run().unwrap();
    assert_eq!(sim.stats().mistyped, 2);
    assert_eq!(sim.actor(sink).unwrap().got, ["Plain(1)"]);
    assert!(sim.take_probe(probe).is_empty());
}
