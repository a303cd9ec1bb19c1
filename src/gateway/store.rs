//! Durable state in redb: executions and committed calls. A call is
//! committed (fsynced) before the last byte of its response leaves, so an
//! answered call survives kill -9; a call cut off before its commit leaves
//! nothing. On start the gateway reads everything back in commit order.

use std::path::Path;

use redb::{Database, ReadableTable, TableDefinition};

use super::execution::{ExecutionMeta, StoredCall};

const EXECUTIONS: TableDefinition<&str, &str> = TableDefinition::new("executions");
/// (execution, commit sequence) → StoredCall JSON.
const CALLS: TableDefinition<(&str, u64), &str> = TableDefinition::new("calls");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store database: {0}")]
    Db(String),
    #[error("store row is not valid: {0}")]
    Row(#[from] serde_json::Error),
}

fn db<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Db(e.to_string())
}

pub struct Store {
    db: Database,
}

/// Everything read back on start.
pub struct Loaded {
    pub executions: Vec<ExecutionMeta>,
    /// Per execution, in commit order.
    pub calls: Vec<(String, StoredCall)>,
}

impl Store {
    /// Opens (or creates) `DIR/gateway.redb`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(db)?;
        let database = Database::create(dir.join("gateway.redb")).map_err(db)?;
        Self::init(database)
    }

    /// A store that lives in memory only.
    pub fn temporary() -> Result<Store, StoreError> {
        let database = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(db)?;
        Self::init(database)
    }

    fn init(database: Database) -> Result<Store, StoreError> {
        let tx = database.begin_write().map_err(db)?;
        tx.open_table(EXECUTIONS).map_err(db)?;
        tx.open_table(CALLS).map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(Store { db: database })
    }

    pub fn put_execution(&self, meta: &ExecutionMeta) -> Result<(), StoreError> {
        let json = serde_json::to_string(meta)?;
        let tx = self.db.begin_write().map_err(db)?;
        tx.open_table(EXECUTIONS)
            .map_err(db)?
            .insert(meta.id.as_str(), json.as_str())
            .map_err(db)?;
        tx.commit().map_err(db)
    }

    pub fn put_call(&self, seq: u64, call: &StoredCall) -> Result<(), StoreError> {
        let json = serde_json::to_string(call)?;
        let tx = self.db.begin_write().map_err(db)?;
        tx.open_table(CALLS)
            .map_err(db)?
            .insert((call.record.execution.as_str(), seq), json.as_str())
            .map_err(db)?;
        tx.commit().map_err(db)
    }

    pub fn load(&self) -> Result<Loaded, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let mut executions = Vec::new();
        for row in tx.open_table(EXECUTIONS).map_err(db)?.iter().map_err(db)? {
            let (_, v) = row.map_err(db)?;
            executions.push(serde_json::from_str(v.value())?);
        }
        let mut calls = Vec::new();
        for row in tx.open_table(CALLS).map_err(db)?.iter().map_err(db)? {
            let (k, v) = row.map_err(db)?;
            calls.push((k.value().0.to_string(), serde_json::from_str(v.value())?));
        }
        Ok(Loaded { executions, calls })
    }
}
