#pragma once
// The status page's assets (ops/status_page/), embedded in the program at build time
// (ops/status_page/embed.cmake): GET / serves kStatusHtml, /status.js and /status.css the others.
namespace starling::ops {

extern const char kStatusHtml[];
extern const char kStatusJs[];
extern const char kStatusCss[];

}  // namespace starling::ops
