//! Behaviour tests of canary against real servers on loopback. One test binary, one module per
//! area, to keep link time down.

mod stores;
mod support;

mod alerts;
mod audit;
mod canary_run;
mod cli;
mod deadlines;
mod exhaustion;
mod failures;
mod kill_switch;
mod real_model;
mod recipes;
mod rendering;
mod report_page;
mod retention;
mod review;
mod router;
mod sampled;
mod schedule;
mod shared_store;
mod smtp;
mod starter;
