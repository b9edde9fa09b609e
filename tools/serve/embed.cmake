# cmake -DIN=page.html -DOUT=page.c -DNAME=serve_page_html -P embed.cmake
# Writes IN's bytes as a C array NAME (NUL-terminated) and NAME_length, so that a program carries
# the file inside it.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR length "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n"
       bytes "${bytes}")
file(WRITE "${OUT}.tmp"
     "/* Generated from ${IN} by tools/serve/embed.cmake; do not edit. */\n"
     "#include <stddef.h>\n"
     "const unsigned char ${NAME}[] = {\n${bytes}0x00};\n"
     "const size_t ${NAME}_length = ${length};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
