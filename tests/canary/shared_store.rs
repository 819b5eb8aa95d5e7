//! A store shared by several runners: PostgreSQL with leases, shards, exactly-once alerts and
//! copies between engines.
