//! Inventories and queues for the gpu-sched benches.
