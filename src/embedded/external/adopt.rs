//! A warm resume: the harnesses a lost head left running are adopted by
//! the resumed head rather than killed, so hours of their work survive the
//! head's loss.
//!
//! What makes it possible is durable already: each gateway execution's
//! row in the store says which run, incarnation, group and query it
//! belongs to, where its workspace and log are and when it started
//! ([`Launched`]); its calls' records are in the store; the harness writes
//! its exit code to a status file when it ends (see
//! [`super::launcher`]); and /proc shows which harnesses still run (their
//! environment names the run and the execution).
//!
//! The rule: a group of a lost head is adopted whole unless a step the
//! checkpoint holds trained it (the journal names each step's groups:
//! `Line::Sealed`), provided something of it is left: a harness still
//! running, or members that ended by themselves (status written). Its
//! running members are waited for, its ended ones are scored again from
//! their workspaces, and its members that never started or were killed
//! are started afresh on the group's query. So a group waiting in the
//! lost head's buffer, or trained by an update the checkpoint does not
//! hold, is trained again from the same work, and none twice. Adopted
//! groups become the resumed run's first groups, which its boundary
//! dispatch sends at once ((φ+μ)·B of them), oldest first; the rest are
//! redone. A running harness must reach the resumed gateway where it
//! reached the lost one: it is adopted only if it was launched with the
//! resumed head's API address (otherwise it is killed). Each adopted
//! execution is relabelled with the resumed head's incarnation and group,
//! so a later resume judges it by that head's journal.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use gyre_actors::sched::proto::harness::HarnessOutcome;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::launcher::outcome_of_code;
use crate::gateway::execution::ExecutionMeta;

/// What the front records of every harness it starts, as its gateway
/// execution's `query` object: what a later head needs to adopt it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launched {
    pub query: u64,
    pub group: u64,
    /// The run's tag (`GYRE_RUN`).
    pub run: String,
    /// 0 for the run's first head, n for its n-th resume.
    pub incarnation: u64,
    /// The gateway address the harness was given.
    pub api_base: String,
    pub workspace: PathBuf,
    pub log: PathBuf,
    /// Unix milliseconds.
    pub started_ms: u64,
    /// The (incarnation, group) labels it had before heads adopted it,
    /// oldest first: what an audit checks no checkpointed step trained.
    #[serde(default)]
    pub adopted_from: Vec<(u64, u64)>,
}

impl Launched {
    pub fn started(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(self.started_ms)
    }

    pub fn of(meta: &ExecutionMeta) -> Option<Launched> {
        serde_json::from_value(meta.query.clone()?).ok()
    }
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where an adopted execution's harness stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Still running, as the leader of its process group.
    Running(Pid),
    /// Ended by itself with this outcome (its status file).
    Ended(HarnessOutcome),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub id: String,
    pub key: String,
    pub launched: Launched,
    pub state: State,
    /// Calls it had recorded: work kept rather than redone.
    pub records: u64,
}

/// One group of the lost head, as the resumed head takes it over.
#[derive(Debug, Clone, PartialEq)]
pub struct AdoptedGroup {
    pub query: u64,
    /// Running members first, then ended ones.
    pub members: VecDeque<Member>,
}

/// What a resumed head adopts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub groups: Vec<AdoptedGroup>,
    /// The executions whose harnesses keep running.
    pub running: BTreeSet<String>,
    /// Their ended members (scored again).
    pub ended: u64,
    /// The records of every adopted member.
    pub records: u64,
    /// Adoptable groups beyond the resumed run's first dispatch (redone;
    /// their harnesses are killed).
    pub groups_left: u64,
}

/// The adoption plan over the store's `executions` (each with its
/// records' count), given the harness process-group leaders that run
/// (`leaders`, by execution), what each status file holds (`status`), the
/// run's tag, the resumed gateway's address, the groups the checkpoint
/// holds trained (`trained`: (incarnation, group)) and how many groups the
/// resumed run dispatches first.
pub fn plan(
    executions: &[(ExecutionMeta, usize)],
    leaders: &BTreeMap<String, Pid>,
    status: impl Fn(&Path) -> Option<i32>,
    run: &str,
    api_base: &str,
    trained: &BTreeSet<(u64, u64)>,
    max_groups: usize,
) -> Plan {
    let mut groups: BTreeMap<(u64, u64), Vec<Member>> = BTreeMap::new();
    for (meta, records) in executions {
        let Some(launched) = Launched::of(meta) else {
            continue;
        };
        let id = (launched.incarnation, launched.group);
        if launched.run != run || trained.contains(&id) {
            continue;
        }
        let ended = status(&launched.log.with_extension("status"));
        let state = match (ended, leaders.get(&meta.id)) {
            (Some(code), _) => State::Ended(outcome_of_code(code)),
            (None, Some(&pid)) if launched.api_base == api_base => State::Running(pid),
            // Killed (an abort, a timeout, the head's end), or calling
            // another address: not adopted.
            _ => continue,
        };
        groups.entry(id).or_default().push(Member {
            id: meta.id.clone(),
            key: meta.key.clone(),
            launched,
            state,
            records: *records as u64,
        });
    }
    let mut out = Plan::default();
    for (_, mut members) in groups {
        if out.groups.len() >= max_groups {
            out.groups_left += 1;
            continue;
        }
        members.sort_by_key(|m| (!matches!(m.state, State::Running(_)), m.launched.started_ms));
        for m in &members {
            out.records += m.records;
            match m.state {
                State::Running(_) => {
                    out.running.insert(m.id.clone());
                }
                State::Ended(_) => out.ended += 1,
            }
        }
        out.groups.push(AdoptedGroup {
            query: members[0].launched.query,
            members: members.into(),
        });
    }
    out
}

/// What the front starts for one execution of the resumed run.
#[derive(Debug, Clone, PartialEq)]
pub enum Take {
    /// A member of an adopted group.
    Member(Box<Member>),
    /// A fresh harness on this query (an adopted group's, or the task's).
    Fresh(Option<u64>),
}

/// The adopted groups as the resumed run's groups take them: the first
/// execution of each new group binds the next adopted group to it.
#[derive(Debug, Default)]
pub struct Adoption {
    pending: VecDeque<AdoptedGroup>,
    bound: BTreeMap<u64, AdoptedGroup>,
}

impl Adoption {
    pub fn new(plan: &Plan) -> Self {
        Self {
            pending: plan.groups.iter().cloned().collect(),
            bound: BTreeMap::new(),
        }
    }

    /// What the next execution of `group` (the resumed run's id) starts.
    pub fn take(&mut self, group: u64) -> Take {
        if !self.bound.contains_key(&group) {
            match self.pending.pop_front() {
                Some(g) => {
                    self.bound.insert(group, g);
                }
                None => return Take::Fresh(None),
            }
        }
        let Some(g) = self.bound.get_mut(&group) else {
            return Take::Fresh(None);
        };
        match g.members.pop_front() {
            Some(m) => Take::Member(Box::new(m)),
            None => Take::Fresh(Some(g.query)),
        }
    }

    /// The running harnesses no execution took (the run ended first).
    pub fn untaken_leaders(&self) -> Vec<Pid> {
        self.pending
            .iter()
            .chain(self.bound.values())
            .flat_map(|g| &g.members)
            .filter_map(|m| match m.state {
                State::Running(pid) => Some(pid),
                State::Ended(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: &str, incarnation: u64, group: u64, api: &str) -> ExecutionMeta {
        let launched = Launched {
            query: group * 10,
            group,
            run: "/r".into(),
            incarnation,
            api_base: api.into(),
            workspace: format!("/w/{id}").into(),
            log: format!("/l/{id}.log").into(),
            started_ms: id.len() as u64,
            adopted_from: Vec::new(),
        };
        ExecutionMeta {
            id: id.into(),
            key: format!("k-{id}"),
            query: Some(serde_json::to_value(&launched).unwrap()),
            group: Some(group.to_string()),
            closed: false,
        }
    }

    #[test]
    fn untrained_groups_with_work_left_are_adopted_whole_and_no_other() {
        let api = "http://127.0.0.1:7000";
        let execs = vec![
            // Group (0, 1): one running, one ended, one killed.
            meta("a", 0, 1, api),
            meta("bb", 0, 1, api),
            meta("ccc", 0, 1, api),
            // Group (0, 2): ended, trained by a checkpointed step.
            meta("d", 0, 2, api),
            // Group (0, 6): ended, not trained (in the buffer, or a lost
            // step's): adopted.
            meta("dd", 0, 6, api),
            // Group (1, 0) of a later head: running.
            meta("e", 1, 0, api),
            // Running, but calling another address: killed.
            meta("f", 1, 3, "http://127.0.0.1:7001"),
            // An old row without what adoption needs.
            ExecutionMeta {
                query: Some(serde_json::json!({"query": 3})),
                ..meta("g", 0, 4, api)
            },
        ];
        let mut other_run = meta("h", 0, 5, api);
        other_run.query.as_mut().unwrap()["run"] = "/other".into();
        let execs: Vec<_> = execs
            .into_iter()
            .chain([other_run])
            .map(|m| (m, 2))
            .collect();
        let pid = Pid::from_raw;
        let leaders: BTreeMap<String, Pid> = [("a", 11), ("e", 12), ("f", 13), ("h", 14)]
            .into_iter()
            .map(|(e, p)| (e.to_string(), pid(p)))
            .collect();
        let status = |p: &Path| match p.to_str().unwrap() {
            "/l/bb.status" => Some(0),
            "/l/d.status" | "/l/dd.status" => Some(1),
            _ => None,
        };
        let trained: BTreeSet<(u64, u64)> = [(0, 2)].into();
        let p = plan(&execs, &leaders, status, "/r", api, &trained, 8);
        let ids: Vec<Vec<&str>> = p
            .groups
            .iter()
            .map(|g| g.members.iter().map(|m| m.id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["a", "bb"], vec!["dd"], vec!["e"]]);
        assert_eq!(p.groups[0].query, 10);
        assert_eq!(p.groups[0].members[0].state, State::Running(pid(11)));
        assert_eq!(
            p.groups[0].members[1].state,
            State::Ended(HarnessOutcome::Completed)
        );
        assert_eq!(
            p.groups[1].members[0].state,
            State::Ended(HarnessOutcome::Failed { complete: false })
        );
        assert_eq!(
            p.running,
            ["a", "e"].into_iter().map(String::from).collect()
        );
        assert_eq!((p.ended, p.groups_left, p.records), (2, 0, 8));
        // Beyond the first dispatch: left out, oldest kept.
        let p = plan(&execs, &leaders, status, "/r", api, &trained, 1);
        assert_eq!(p.groups.len(), 1);
        assert_eq!(p.groups_left, 2);
        assert!(!p.running.contains("e"));
        // Without the journal's word, the trained group would be adopted.
        let p = plan(&execs, &leaders, status, "/r", api, &BTreeSet::new(), 8);
        assert_eq!(p.groups.len(), 4);
    }

    #[test]
    fn each_new_group_takes_an_adopted_group_then_starts_afresh() {
        let api = "http://x";
        let execs = vec![
            (meta("a", 0, 1, api), 0),
            (meta("b", 0, 1, api), 0),
            (meta("c", 0, 2, api), 0),
        ];
        let leaders: BTreeMap<String, Pid> = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, e)| (e.to_string(), Pid::from_raw(100 + i as i32)))
            .collect();
        let p = plan(&execs, &leaders, |_| None, "/r", api, &BTreeSet::new(), 4);
        let mut a = Adoption::new(&p);
        let id = |t: Take| match t {
            Take::Member(m) => m.id,
            Take::Fresh(q) => format!("fresh {q:?}"),
        };
        // New group 7 takes group (0, 1), new group 3 takes (0, 2).
        assert_eq!(id(a.take(7)), "a");
        assert_eq!(id(a.take(3)), "c");
        assert_eq!(id(a.take(7)), "b");
        assert_eq!(id(a.take(7)), "fresh Some(10)");
        assert_eq!(id(a.take(3)), "fresh Some(20)");
        assert_eq!(id(a.take(9)), "fresh None");
        assert!(a.untaken_leaders().is_empty());
        let a = Adoption::new(&p);
        assert_eq!(a.untaken_leaders().len(), 3);
    }
}
