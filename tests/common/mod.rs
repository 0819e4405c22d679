pub mod bounds;
pub mod keyed_models;
pub mod log_model;
pub mod model;
pub mod nginx_model;
pub mod rng;
pub mod strategies;
pub mod window_model;
