//! The training set as a growing prefix.
//!
//! Transitions are serial, core first, then satellites in index order, and a
//! cell that entered training stays for the rest of the burst (SPEC 2.3), so
//! the training set is always {0..k−1}. That is what lets the core build the
//! K − 1 prefix communication groups up front (SPEC 2.6).

use crate::sched::maths::ledger::Role;

/// Whether the sorted, distinct cells `members` are exactly {0..len−1}.
pub fn is_prefix(members: impl IntoIterator<Item = u32>) -> bool {
    members
        .into_iter()
        .enumerate()
        .all(|(i, c)| i as u64 == u64::from(c))
}

/// The cells in the training set, which must be a prefix.
pub fn training_set(roles: &[Role]) -> Vec<u32> {
    roles
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_training_side())
        .map(|(i, _)| i as u32)
        .collect()
}

/// The next cell to switch under serial transitions: the one just past the
/// training prefix, if it is in rollout and no switch is under way.
pub fn next_to_switch(roles: &[Role]) -> Option<u32> {
    if roles.contains(&Role::ToTraining) {
        return None;
    }
    let k = roles.iter().take_while(|r| **r == Role::Training).count();
    (roles.get(k) == Some(&Role::Rollout)).then_some(k as u32)
}

/// The index of the communication group that spans the prefix {0..members−1},
/// among the K − 1 groups {0..1}, …, {0..K−1}; none for a lone core.
pub fn comm_group_for(members: u32) -> Option<u32> {
    members.checked_sub(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Role::*;

    #[test]
    fn prefixes_are_recognised() {
        assert!(is_prefix([]));
        assert!(is_prefix([0]));
        assert!(is_prefix([0, 1, 2]));
        assert!(!is_prefix([1]));
        assert!(!is_prefix([0, 2]));
    }

    #[test]
    fn next_cell_follows_the_prefix_serially() {
        assert_eq!(next_to_switch(&[Rollout, Rollout]), Some(0));
        assert_eq!(next_to_switch(&[Training, Rollout]), Some(1));
        assert_eq!(next_to_switch(&[ToTraining, Rollout]), None);
        assert_eq!(next_to_switch(&[Training, Training]), None);
        // The next cell is still coming back from the last burst: wait.
        assert_eq!(next_to_switch(&[Training, Returning, Rollout]), None);
        // K = 1.
        assert_eq!(next_to_switch(&[Rollout]), Some(0));
        assert_eq!(next_to_switch(&[Training]), None);
    }

    #[test]
    fn training_set_reads_roles() {
        assert_eq!(training_set(&[Training, ToTraining, Returning]), vec![0, 1]);
        assert!(is_prefix(training_set(&[Training, ToTraining, Rollout])));
        assert!(!is_prefix(training_set(&[Returning, Training])));
    }

    #[test]
    fn communication_group_of_a_prefix() {
        assert_eq!(comm_group_for(1), None);
        assert_eq!(comm_group_for(2), Some(0));
        assert_eq!(comm_group_for(8), Some(6));
        assert_eq!(comm_group_for(0), None);
    }
}
