//! NNI search spaces: parse, validate, sample, encode.
