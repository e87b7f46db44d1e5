mod space;
