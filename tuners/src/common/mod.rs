//! Pieces several tuners share.

pub(crate) mod args;
pub(crate) mod grid;
pub(crate) mod history;
pub(crate) mod numeric;
pub(crate) mod observed;
pub(crate) mod quantile;
pub(crate) mod seed;
pub(crate) mod unseen;
