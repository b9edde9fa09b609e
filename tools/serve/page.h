/* luna-serve's web page (GET /): tools/serve/page.html, compiled in by CMake
 * (tools/serve/embed.cmake) so the program is one file. */
#ifndef LUNA_SERVE_PAGE_H
#define LUNA_SERVE_PAGE_H

#include <stddef.h>

extern const unsigned char serve_page_html[];
extern const size_t serve_page_html_length;

#endif
