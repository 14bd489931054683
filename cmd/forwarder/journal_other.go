//go:build !unix

package main

import "os"

// onJournal: there is no systemd journal here.
func onJournal(*os.File) bool { return false }
