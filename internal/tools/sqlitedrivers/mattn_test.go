//go:build mattn && cgo

package sqlitedrivers

import (
	"database/sql"

	_ "github.com/mattn/go-sqlite3" // database/sql driver "sqlite3", cgo
)

func init() {
	drivers = append(drivers, driverCase{name: "mattn-cgo", open: func(path string) (*sql.DB, error) {
		return sql.Open("sqlite3", "file:"+path+"?_txlock=immediate")
	}})
}
