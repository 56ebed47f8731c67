// kit/cuda/emu/include/cudnn.h: in the EMU=1 build this folder comes first on the include path, so the kit's
// `#include <cudnn.h>` reads the emulator's declarations (kit/cuda/emu/cudnn_emu.h) instead of cuDNN's.
#include "../cudnn_emu.h"
