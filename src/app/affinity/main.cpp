// Placeholder main until the CLI lands (src/app/affinity).
#include <cstdio>
int main() { std::puts("affinity: CLI not built yet"); return 1; }
