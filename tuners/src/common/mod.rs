//! Pieces several tuners share.

pub(crate) mod args;
pub(crate) mod grid;
pub(crate) mod history;
pub(crate) mod lbfgs;
pub(crate) mod linalg;
pub(crate) mod normal_tail;
pub(crate) mod numeric;
pub(crate) mod observed;
pub(crate) mod quantile;
pub(crate) mod running;
pub(crate) mod seed;
pub(crate) mod unit_cube;
pub(crate) mod unseen;
