//! The run record (`gyre train --record RUN.jsonl`): what one run did, as
//! versioned JSON lines, so a user can calibrate the simulator against
//! their own cluster (`gyre simulate --replay RUN.jsonl`).
//!
//! One JSON object per line, each tagged by `kind`; the first line is the
//! `header` (schema version, host, seed, the scheduling configuration and
//! the link latencies), then in any order:
//! - `execution`: dispatch, start, every model call (gap before it,
//!   prompt and output tokens, the engine's service time of the attempt
//!   that answered, attempts), end, outcome, evaluation attempts;
//! - `op`: one backend operation (trainer, device memory, engine control,
//!   transfer) of a cell with its start and end: the cost model;
//! - `switch`: one role change of a cell, with the costs of the operations
//!   inside it;
//! - `step`: one training step: its micro-steps, training time, optimizer
//!   update and when it ended.
//!
//! Times are nanoseconds from the run's start (virtual on the simulator
//! host, real on the live host). Unknown fields and kinds are refused, and
//! every refusal names the line and the field ([`read`]).

use std::collections::BTreeSet;
use std::io::{BufRead, Write};

use gyre_actors::sched::SchedConfig;
use gyre_runtime::Nanos;
use serde::{Deserialize, Serialize};

/// The schema this code writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    Header(Box<Header>),
    Execution(Execution),
    Op(Op),
    Switch(Switch),
    Step(Step),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub schema: u32,
    /// `sim` or `live`.
    pub host: String,
    pub seed: u64,
    pub sched: SchedConfig,
    /// One-way latency between nodes and within one node.
    pub link_ns: Nanos,
    pub local_link_ns: Nanos,
}

/// How an execution ended, as its harness saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Completed,
    HarnessTimeout,
    /// Crashed after doing some work: scored as partial.
    Failed,
    /// Nothing could be run: a dummy.
    FailedComplete,
    /// Ended by its execution (overall timeout or over-sampling surplus).
    Aborted,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Call {
    pub seq: u32,
    /// Tool and think time before the call: since the previous answer (or
    /// the start).
    pub gap_ns: Nanos,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub issued_ns: Nanos,
    /// `None`: never answered (the run was aborted).
    pub answered_ns: Option<Nanos>,
    /// The engine's time on the attempt that answered (accepted → done).
    pub service_ns: Option<Nanos>,
    pub attempts: u32,
    /// `cell N` or `pool`: the engine that answered.
    pub engine: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalAttempt {
    pub at_ns: Nanos,
    pub took_ns: Nanos,
    pub ok: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Execution {
    pub exec: u64,
    pub group: u64,
    /// When the scheduler dispatched it (the simulator host observes it;
    /// `None` on the live host).
    pub dispatch_ns: Option<Nanos>,
    pub start_ns: Nanos,
    /// `None`: still running when the run ended.
    pub end_ns: Option<Nanos>,
    pub outcome: Option<Outcome>,
    pub calls: Vec<Call>,
    pub eval: Vec<EvalAttempt>,
}

/// A backend operation's kind: `trainer.warmup`, `trainer.fwd_bwd`,
/// `trainer.drain`, `trainer.reduce`, `trainer.update`,
/// `memory.release_rollout`, `memory.release_training`,
/// `memory.restore_rollout`, `memory.restore_training`, `engine.unload`,
/// `engine.load`, `engine.pin`, `engine.cancel`, `engine.release_kv`,
/// `engine.set_weights`, `transfer.read`, `transfer.expose`,
/// `transfer.publish`.
pub const OP_KINDS: &[&str] = &[
    "trainer.warmup",
    "trainer.fwd_bwd",
    "trainer.drain",
    "trainer.reduce",
    "trainer.update",
    "memory.release_rollout",
    "memory.release_training",
    "memory.restore_rollout",
    "memory.restore_training",
    "engine.unload",
    "engine.load",
    "engine.pin",
    "engine.cancel",
    "engine.release_kv",
    "engine.set_weights",
    "transfer.read",
    "transfer.expose",
    "transfer.publish",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Op {
    /// `None` for the transfer engine and (`engine.*`) the pool's engine.
    pub cell: Option<u32>,
    pub op: String,
    pub start_ns: Nanos,
    pub end_ns: Nanos,
    /// The training step it belongs to, where it has one, counted from 0
    /// (the `step` line of the first step is 1).
    pub step: Option<u64>,
    /// Tokens of a micro-step.
    pub tokens: Option<u64>,
    /// How long the request waited at its backend before this operation
    /// began (behind the one job in flight and those queued before it):
    /// a serial backend's queueing, which `start_ns − queued_ns` is the
    /// arrival of. Absent in records of older builds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_ns: Option<Nanos>,
    /// `engine.pin`: the executions whose blocks it pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execs: Option<Vec<u64>>,
}

/// The role a cell changes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Training,
    Rollout,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Switch {
    pub cell: u32,
    pub to: Role,
    /// It left its role (draining, or returning).
    pub begin_ns: Nanos,
    /// It holds the new role.
    pub end_ns: Nanos,
    /// Steps trained before it began, and the burst that makes
    /// (`steps / μ`).
    pub step: u64,
    pub burst: u64,
    /// Operations of this cell inside the switch: (kind, duration).
    pub costs: Vec<(String, Nanos)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MicroStep {
    pub cell: u32,
    pub tokens: u64,
    pub took_ns: Nanos,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// 1 for the first update.
    pub step: u64,
    pub micro_steps: Vec<MicroStep>,
    /// Sum of the micro-steps' times over every cell.
    pub train_ns: Nanos,
    /// The core's optimizer update.
    pub update_ns: Nanos,
    /// When the update finished (the new version is published then).
    pub end_ns: Nanos,
}

/// A whole record, in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    pub header: Header,
    pub executions: Vec<Execution>,
    pub ops: Vec<Op>,
    pub switches: Vec<Switch>,
    pub steps: Vec<Step>,
}

/// Why a record was refused: the line (1-based) and the field.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("line {line}: field `{field}`: {message}")]
    Field {
        line: usize,
        field: String,
        message: String,
    },
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
    #[error("reading the record: {0}")]
    Io(#[from] std::io::Error),
}

fn field(line: usize, field: impl Into<String>, message: impl Into<String>) -> RecordError {
    RecordError::Field {
        line,
        field: field.into(),
        message: message.into(),
    }
}

impl Recording {
    /// Writes the record as JSON lines, header first.
    pub fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut put = |l: Line| -> std::io::Result<()> {
            serde_json::to_writer(&mut *out, &l)?;
            out.write_all(b"\n")
        };
        put(Line::Header(Box::new(self.header.clone())))?;
        for e in &self.executions {
            put(Line::Execution(e.clone()))?;
        }
        for o in &self.ops {
            put(Line::Op(o.clone()))?;
        }
        for s in &self.switches {
            put(Line::Switch(s.clone()))?;
        }
        for s in &self.steps {
            put(Line::Step(s.clone()))?;
        }
        Ok(())
    }
}

/// Parses one line, naming the field a refusal is about: the kind is read
/// first, then the line as that kind's struct, so the path of a bad field
/// survives (`calls[2].prompt_tokens`).
fn parse_line(n: usize, text: &str) -> Result<Line, RecordError> {
    let mut v: serde_json::Value = serde_json::from_str(text).map_err(|e| RecordError::Line {
        line: n,
        message: e.to_string(),
    })?;
    let kind = match v.as_object_mut().and_then(|o| o.remove("kind")) {
        Some(serde_json::Value::String(k)) => k,
        _ => return Err(field(n, "kind", "missing, or not a string")),
    };
    Ok(match kind.as_str() {
        "header" => Line::Header(Box::new(typed(n, v)?)),
        "execution" => Line::Execution(typed(n, v)?),
        "op" => Line::Op(typed(n, v)?),
        "switch" => Line::Switch(typed(n, v)?),
        "step" => Line::Step(typed(n, v)?),
        other => return Err(field(n, "kind", format!("unknown kind `{other}`"))),
    })
}

fn typed<T: serde::de::DeserializeOwned>(n: usize, v: serde_json::Value) -> Result<T, RecordError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        // An unknown field is named by serde itself.
        let name = match (path.as_str(), unknown_field(&message)) {
            (_, Some(f)) => f,
            (".", None) => "line".to_owned(),
            _ => path,
        };
        field(n, name, message)
    })
}

fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest.split('`').next()?.to_owned())
}

/// Reads and checks a record: the header first with a schema this code
/// reads, every line well formed, times in order, executions and steps
/// each recorded once.
pub fn read(input: impl BufRead) -> Result<Recording, RecordError> {
    let mut header = None;
    let (mut executions, mut ops, mut switches, mut steps) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut seen_execs = BTreeSet::new();
    let mut seen_steps = BTreeSet::new();
    for (i, text) in input.lines().enumerate() {
        let n = i + 1;
        let text = text?;
        if text.trim().is_empty() {
            continue;
        }
        let line = parse_line(n, &text)?;
        match (&header, line) {
            (None, Line::Header(h)) => {
                if h.schema != SCHEMA_VERSION {
                    return Err(field(
                        n,
                        "schema",
                        format!("version {} (this build reads {SCHEMA_VERSION})", h.schema),
                    ));
                }
                if h.host != "sim" && h.host != "live" {
                    return Err(field(n, "host", format!("`{}`: sim or live", h.host)));
                }
                h.sched
                    .validate()
                    .map_err(|e| field(n, "sched", e.to_string()))?;
                header = Some(*h);
            }
            (None, _) => {
                return Err(RecordError::Line {
                    line: n,
                    message: "the first line must be the header".into(),
                });
            }
            (Some(_), Line::Header(_)) => {
                return Err(field(n, "kind", "a second header"));
            }
            (Some(_), Line::Execution(e)) => {
                check_execution(n, &e)?;
                if !seen_execs.insert(e.exec) {
                    return Err(field(n, "exec", format!("execution {} twice", e.exec)));
                }
                executions.push(e);
            }
            (Some(_), Line::Op(o)) => {
                if !OP_KINDS.contains(&o.op.as_str()) {
                    return Err(field(n, "op", format!("unknown operation `{}`", o.op)));
                }
                if o.end_ns < o.start_ns {
                    return Err(field(n, "end_ns", "before start_ns"));
                }
                ops.push(o);
            }
            (Some(_), Line::Switch(s)) => {
                if s.end_ns < s.begin_ns {
                    return Err(field(n, "end_ns", "before begin_ns"));
                }
                switches.push(s);
            }
            (Some(h), Line::Step(s)) => {
                if s.step == 0 || s.step > h.sched.target_steps {
                    return Err(field(
                        n,
                        "step",
                        format!("{} outside 1..={}", s.step, h.sched.target_steps),
                    ));
                }
                if !seen_steps.insert(s.step) {
                    return Err(field(n, "step", format!("step {} twice", s.step)));
                }
                steps.push(s);
            }
        }
    }
    let header = header.ok_or(RecordError::Line {
        line: 1,
        message: "empty record: no header".into(),
    })?;
    steps.sort_by_key(|s| s.step);
    executions.sort_by_key(|e| e.exec);
    Ok(Recording {
        header,
        executions,
        ops,
        switches,
        steps,
    })
}

fn check_execution(n: usize, e: &Execution) -> Result<(), RecordError> {
    if let Some(d) = e.dispatch_ns
        && d > e.start_ns
    {
        return Err(field(n, "start_ns", "before dispatch_ns"));
    }
    if let Some(end) = e.end_ns
        && end < e.start_ns
    {
        return Err(field(n, "end_ns", "before start_ns"));
    }
    for (i, c) in e.calls.iter().enumerate() {
        if c.issued_ns < e.start_ns {
            return Err(field(n, format!("calls[{i}].issued_ns"), "before start_ns"));
        }
        if let Some(a) = c.answered_ns
            && a < c.issued_ns
        {
            return Err(field(
                n,
                format!("calls[{i}].answered_ns"),
                "before issued_ns",
            ));
        }
        if c.attempts == 0 {
            return Err(field(
                n,
                format!("calls[{i}].attempts"),
                "must be at least 1",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            schema: SCHEMA_VERSION,
            host: "sim".into(),
            seed: 1,
            sched: SchedConfig::default(),
            link_ns: 100_000,
            local_link_ns: 10_000,
        }
    }

    fn exec() -> Execution {
        Execution {
            exec: 0,
            group: 0,
            dispatch_ns: Some(5),
            start_ns: 10,
            end_ns: Some(100),
            outcome: Some(Outcome::Completed),
            calls: vec![Call {
                seq: 0,
                gap_ns: 0,
                prompt_tokens: 12,
                output_tokens: 4,
                issued_ns: 10,
                answered_ns: Some(30),
                service_ns: Some(15),
                attempts: 1,
                engine: Some("cell 1".into()),
            }],
            eval: vec![EvalAttempt {
                at_ns: 101,
                took_ns: 0,
                ok: true,
            }],
        }
    }

    fn text(r: &Recording) -> String {
        let mut out = Vec::new();
        r.write(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn sample() -> Recording {
        Recording {
            header: header(),
            executions: vec![exec()],
            ops: vec![Op {
                cell: Some(0),
                op: "trainer.update".into(),
                start_ns: 1,
                end_ns: 2,
                step: Some(1),
                tokens: None,
                queued_ns: Some(0),
                execs: None,
            }],
            switches: vec![Switch {
                cell: 1,
                to: Role::Training,
                begin_ns: 3,
                end_ns: 4,
                step: 0,
                burst: 0,
                costs: vec![("engine.unload".into(), 1)],
            }],
            steps: vec![Step {
                step: 1,
                micro_steps: vec![MicroStep {
                    cell: 0,
                    tokens: 9,
                    took_ns: 3,
                }],
                train_ns: 3,
                update_ns: 1,
                end_ns: 2,
            }],
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = sample();
        let back = read(text(&r).as_bytes()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn bad_lines_are_refused_naming_line_and_field() {
        let good = text(&sample());
        let lines: Vec<&str> = good.lines().collect();
        let with = |n: usize, bad: String| {
            let mut l: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
            l[n] = bad;
            read(l.join("\n").as_bytes()).unwrap_err().to_string()
        };
        let e = with(
            1,
            lines[1].replace("\"prompt_tokens\":12", "\"prompt_tokens\":-1"),
        );
        assert!(
            e.contains("line 2") && e.contains("calls[0].prompt_tokens"),
            "{e}"
        );
        let e = with(
            1,
            lines[1].replace("\"group\":0", "\"group\":0,\"colour\":1"),
        );
        assert!(e.contains("line 2") && e.contains("colour"), "{e}");
        let e = with(2, lines[2].replace("trainer.update", "trainer.dance"));
        assert!(e.contains("line 3") && e.contains("`op`"), "{e}");
        let e = with(0, lines[0].replace("\"schema\":1", "\"schema\":9"));
        assert!(e.contains("line 1") && e.contains("schema"), "{e}");
        let e = with(
            1,
            lines[1].replace("\"answered_ns\":30", "\"answered_ns\":3"),
        );
        assert!(e.contains("calls[0].answered_ns"), "{e}");
        let e = with(4, lines[4].replace("\"step\":1", "\"step\":0"));
        assert!(e.contains("line 5") && e.contains("`step`"), "{e}");
        let e = read(lines[1..].join("\n").as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1") && e.contains("header"), "{e}");
    }
}
