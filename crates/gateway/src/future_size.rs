//! Tests' measure of a future's state: the size of what a function returns, read from its
//! signature without calling it (so without building what its arguments need). The futures
//! that live as long as a request, a connection or a session are held to their size by tests
//! that use these.

/// The size of what a two-argument `f` returns.
pub fn returned2<A, B, R>(_f: impl FnOnce(A, B) -> R) -> usize {
    std::mem::size_of::<R>()
}

/// The size of what a three-argument `f` returns.
pub fn returned3<A, B, C, R>(_f: impl FnOnce(A, B, C) -> R) -> usize {
    std::mem::size_of::<R>()
}

/// The size of what a four-argument `f` returns.
pub fn returned4<A, B, C, D, R>(_f: impl FnOnce(A, B, C, D) -> R) -> usize {
    std::mem::size_of::<R>()
}

/// The size of what a five-argument `f` returns.
pub fn returned5<A, B, C, D, E, R>(_f: impl FnOnce(A, B, C, D, E) -> R) -> usize {
    std::mem::size_of::<R>()
}

/// The size of what a six-argument `f` returns.
pub fn returned6<A, B, C, D, E, F, R>(_f: impl FnOnce(A, B, C, D, E, F) -> R) -> usize {
    std::mem::size_of::<R>()
}

/// The size of what a seven-argument `f` returns.
pub fn returned7<A, B, C, D, E, F, G, R>(_f: impl FnOnce(A, B, C, D, E, F, G) -> R) -> usize {
    std::mem::size_of::<R>()
}
