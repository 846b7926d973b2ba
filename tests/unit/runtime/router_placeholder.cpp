// Test-only: the same stand-in router as the model tests use, until moe/router.cpp is merged.
#include "../model/router_placeholder.cpp"  // NOLINT
