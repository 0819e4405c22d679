pub mod model;
pub mod nginx_model;
