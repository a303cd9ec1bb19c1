//! Errors that name the scenario field at fault, so a user editing a file
//! knows which line to fix.

/// A value of a scenario that cannot run, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// Dotted path of the field, e.g. `cluster.cell_capacity`.
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// `Err` naming `field` unless `ok`.
pub fn check(
    ok: bool,
    field: impl Into<String>,
    reason: impl Into<String>,
) -> Result<(), FieldError> {
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(field, reason))
    }
}
