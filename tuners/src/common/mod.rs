//! Pieces several tuners share.

pub(crate) mod args;
pub(crate) mod grid;
pub(crate) mod history;
pub(crate) mod quantile;
