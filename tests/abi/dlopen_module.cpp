// dlopen_module PATH: loads a shared module with every symbol bound now, as a strict
// loader would, and prints the loader's verdict. Exit 0 if it loaded, 1 if refused.
#include <dlfcn.h>

#include <cstdio>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s MODULE\n", argv[0]);
        return 2;
    }
    void* handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        std::printf("refused: %s\n", dlerror());
        return 1;
    }
    std::printf("loaded\n");
    dlclose(handle);
    return 0;
}
