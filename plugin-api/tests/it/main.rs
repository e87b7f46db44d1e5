mod loader;
mod space;
mod standalone;
