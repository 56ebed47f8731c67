// kit/cuda/emu/include/cuda_runtime.h: in the EMU=1 build this folder comes first on the include path, so the kit's
// `#include <cuda_runtime.h>` reads the emulator's declarations (kit/cuda/emu/cuda_emu.h) instead of the toolkit's.
#include "../cuda_emu.h"
