mod loader;
mod space;
